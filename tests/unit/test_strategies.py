"""Every strategy in one process: save, lose the process, restore bit for bit; DCP format loads with stock dcp.load."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from baft import (
    STRATEGIES,
    CheckpointConfig,
    Checkpointer,
    TrainState,
    digest_components,
)
from baft.config import AsyncDcpConfig, BaftConfig
from baft.persist import commits as persist


def make_state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    return TrainState(model=model, optimizer=opt, scheduler=sched)


def train(st: TrainState, ck: Checkpointer, steps: int) -> None:
    for _ in range(steps):
        ck.begin_iteration()
        loss = st.model(torch.randn(8, 16)).pow(2).mean()
        st.optimizer.zero_grad()
        loss.backward()
        ck.before_optimizer_step()
        st.optimizer.step()
        st.scheduler.step()
        st.step += 1
        ck.after_step()


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "none"] + ["async-dcp:default-copy"])
def test_strategy_restores_its_last_persistent_checkpoint(tmp_path: Path, strategy: str) -> None:
    strategy, _, variant = strategy.partition(":")  # async-dcp with and without DCP's DefaultStager
    cfg = CheckpointConfig(strategy=strategy, every=3, dir=str(tmp_path / "ckpt"),
                           baft=BaftConfig(shm_dir=str(tmp_path / "shm")),
                           async_dcp=AsyncDcpConfig(stager=variant != "default-copy"))
    st = make_state(0)
    ck = Checkpointer(cfg, st)
    ck.attach(torch.nn.Identity())
    assert ck.restore_latest() == 0
    train(st, ck, 6)
    expected = digest_components(st.capture())
    ck.close()  # waits for background writes
    assert persist.latest(tmp_path / "ckpt") == 6
    shutil.rmtree(tmp_path / "shm", ignore_errors=True)  # the node's memory is gone too

    fresh = make_state(1)
    ck2 = Checkpointer(cfg, fresh)
    ck2.attach(torch.nn.Identity())
    assert ck2.restore_latest() == 6
    ck2.close()
    assert digest_components(fresh.capture()) == expected


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "none"])
def test_a_flush_persists_the_state_now_and_only_once(tmp_path: Path, strategy: str) -> None:
    """What a preempted job does in its grace: the state after the last step, between two due boundaries."""
    cfg = CheckpointConfig(strategy=strategy, every=3, dir=str(tmp_path / "ckpt"), baft=BaftConfig(shm_dir=str(tmp_path / "shm")))
    st = make_state(0)
    ck = Checkpointer(cfg, st)
    ck.attach(torch.nn.Identity())
    ck.restore_latest()
    train(st, ck, 5)
    assert ck.flush() == 5 and persist.latest(tmp_path / "ckpt") == 5
    assert ck.flush() is None  # nothing newer
    train(st, ck, 1)  # step 6 is due: written by after_step (baft: at the end of the next iteration, which
    ck.flush()        # seals it first; so the flush writes it)
    assert persist.latest(tmp_path / "ckpt") == 6 and ck.flush() is None
    train(st, ck, 1)
    assert ck.flush() == 7
    expected = digest_components(st.capture())
    ck.close()
    shutil.rmtree(tmp_path / "shm", ignore_errors=True)
    fresh = make_state(1)
    ck2 = Checkpointer(cfg, fresh)
    ck2.attach(torch.nn.Identity())
    assert ck2.restore_latest() == 7
    ck2.close()
    assert digest_components(fresh.capture()) == expected


def test_baft_restores_from_shared_memory_first(tmp_path: Path) -> None:
    cfg = CheckpointConfig(strategy="baft", every=100, dir=str(tmp_path / "ckpt"), baft=BaftConfig(shm_dir=str(tmp_path / "shm")))
    st = make_state(0)
    ck = Checkpointer(cfg, st)
    ck.attach(torch.nn.Identity())
    ck.restore_latest()
    train(st, ck, 4)
    ck.begin_iteration()
    expected = digest_components(st.capture())  # version 4, sealed below
    ck.before_optimizer_step()
    ck.close()
    fresh = make_state(1)
    ck2 = Checkpointer(cfg, fresh)
    ck2.attach(torch.nn.Identity())
    assert ck2.restore_latest() == 4
    ck2.close()
    assert digest_components(fresh.capture()) == expected


def test_dcp_format_loads_with_stock_dcp_load(tmp_path: Path) -> None:
    cfg = CheckpointConfig(strategy="async-dcp", every=2, dir=str(tmp_path))
    st = make_state(0)
    ck = Checkpointer(cfg, st)
    train(st, ck, 2)
    ck.close()
    d = persist.step_dir(tmp_path, 2)
    md = FileSystemReader(str(d)).read_metadata().state_dict_metadata
    template = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in md.items()}
    dcp.load(template, checkpoint_id=str(d))  # plain DCP, no baft code
    weight = st.model.state_dict()["0.weight"]
    assert torch.equal(template["model.0.weight"], weight)  # get_state_dict's keys
    moment = next(s["exp_avg"] for s in st.optimizer.state.values())
    assert torch.equal(template["optimizer.state.0.weight.exp_avg"], moment)
    persist.verify_directory(tmp_path, 2)
    (d / next(n for n in sorted(p.name for p in d.iterdir()) if n.endswith(".distcp"))).write_bytes(b"junk")
    with pytest.raises(persist.CheckpointCorrupt):
        persist.verify_directory(tmp_path, 2)
