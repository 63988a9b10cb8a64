"""The persistent tier's keys are the fully qualified names ``get_state_dict`` gives (``model.<fqn>``,
``optimizer.state.<fqn>.<name>``), so a checkpoint written by a 2-stage pipeline loads, with stock DCP in one
process, into the same model whole or split into 4 stages. Stages whose modules name their tensors alike
(each a bare ``nn.Linear``) would write the same keys, and DCP would keep one of them: those go under
their stage's key instead, and each rank restores its own."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from baft.errors import CheckpointCorrupt
from baft.persist import commits as persist
from baft.persist import dcpformat

from harness.worker.models import build_stage
from harness.worker.shapes import PRESETS
from tests.gloo_ranks import run_ranks

RANK = """
import os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from baft import CheckpointConfig, TrainState
from baft.strategies import BaftStrategy
from harness.worker.models import build_stage
from harness.worker.shapes import PRESETS
from tests.rank_step import train_step

dist.init_process_group("gloo")
rank = dist.get_rank()
out, kind = sys.argv[1], sys.argv[2]
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
shape = PRESETS["mlp"]
if kind == "whole-names":  # the model's stage `rank` of 2, named as in the whole model
    model = build_stage(shape, 3, rank, 2)
    width = shape.in_dim if rank == 0 else shape.width
else:  # every stage a bare Linear: the same names on both stages
    torch.manual_seed(10 + rank)
    model, width = torch.nn.Linear(8, 8), 8
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
config = CheckpointConfig(strategy="baft", every=2, dir=os.path.join(out, "ckpt"), shm_dir=os.path.join(out, "shm"))
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
for step in range(4):
    train_step(strategy, state, step, torch.randn(4, width, generator=torch.Generator().manual_seed(50 + step + rank)))
strategy.close()  # persists step 4
names = {id(p): n for n, p in model.named_parameters()}
moments = {names[id(p)]: s["exp_avg"] for p, s in state.optimizer.state.items()}
torch.save({"model": model.state_dict(), "exp_avg": moments}, os.path.join(out, f"rank{rank}.pt"))
dist.destroy_process_group()
"""


def _train(tmp_path: Path, kind: str) -> tuple[Path, list[dict]]:
    results = run_ranks(RANK, str(tmp_path), kind)
    assert all(code == 0 for code, _ in results), [out for _, out in results]
    root = tmp_path / "ckpt"
    assert persist.committed_steps(root)[0] == 4
    return root, [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]


def test_a_two_stage_checkpoint_loads_whole_and_into_four_stages(tmp_path: Path) -> None:
    root, ranks = _train(tmp_path, "whole-names")
    job = {k: v for r in ranks for k, v in r["model"].items()}  # the whole model's tensors, by name
    assert len(job) == sum(len(r["model"]) for r in ranks)  # no name on both stages
    md = FileSystemReader(str(persist.step_dir(root, 4))).read_metadata().state_dict_metadata
    assert {f"model.{k}" for k in job} <= set(md) and not any(k.startswith("stage") for k in md)

    whole = build_stage(PRESETS["mlp"], 99, 0, 1)  # other weights than the job's: a load that does nothing shows
    assert set(whole.state_dict()) == set(job)
    assert dcpformat.load_model(root, whole) == 4
    for k, v in whole.state_dict().items():
        assert torch.equal(v, job[k]), k
    for s in range(4):  # the same checkpoint into each of four stages
        part = build_stage(PRESETS["mlp"], 99, s, 4)
        dcpformat.load_model(root, part, step=4)
        for k, v in part.state_dict().items():
            assert torch.equal(v, job[k]), (s, k)

    # the optimizer's moments under their parameter's name, as get_optimizer_state_dict keys them
    moments = {k: v for r in ranks for k, v in r["exp_avg"].items()}
    sd = {f"optimizer.state.{n}.exp_avg": torch.empty_like(v) for n, v in moments.items()}
    dcp.load(sd, checkpoint_id=str(persist.step_dir(root, 4)), no_dist=True)
    for n, v in moments.items():
        assert torch.equal(sd[f"optimizer.state.{n}.exp_avg"], v), n


def test_stages_that_share_names_keep_them_apart_under_their_stage_keys(tmp_path: Path) -> None:
    root, ranks = _train(tmp_path, "shared-names")
    assert not torch.equal(ranks[0]["model"]["weight"], ranks[1]["model"]["weight"])
    md = FileSystemReader(str(persist.step_dir(root, 4))).read_metadata().state_dict_metadata
    assert {"stage0/model.weight", "stage1/model.weight"} <= set(md) and "model.weight" not in md
    for r in range(2):  # each rank's own restore gets its own stage's tensors
        restored = dcpformat.load(root, 4, r)
        for k, v in ranks[r]["model"].items():
            assert torch.equal(restored["model"][k], v), (r, k)
    try:
        dcpformat.load_model(root, torch.nn.Linear(8, 8))
    except KeyError as e:
        assert "model.weight" in str(e) and "name their tensors otherwise" in str(e)
    else:
        raise AssertionError("a checkpoint without model.<fqn> keys loaded")


def test_a_two_stage_checkpoint_restores_into_one_stage_with_every_moment_by_name(tmp_path: Path) -> None:
    """``load_restaged``: the components of a rank whose stage holds both old stages' blocks: model and Adam's
    moments by name, the step and the optimizer's hyper-parameters from the old rank named; into a live Adam
    that has no state yet (a fresh process), its parameter indices its own."""
    from baft import TrainState

    root, ranks = _train(tmp_path, "whole-names")
    whole = build_stage(PRESETS["mlp"], 99, 0, 1)
    state = TrainState(model=whole, optimizer=torch.optim.Adam(whole.parameters(), lr=0.5))
    live = state.capture(only=("model", "optimizer"))
    comps = dcpformat.load_restaged(root, 4, 0, live, state.param_names())
    state.restore(comps)
    job = {k: v for r in ranks for k, v in r["model"].items()}
    assert all(torch.equal(v, job[k]) for k, v in whole.state_dict().items())
    moments = {k: v for r in ranks for k, v in r["exp_avg"].items()}
    names = state.param_names()
    got = {names[i]: s["exp_avg"] for i, s in enumerate(state.optimizer.state[p] for p in whole.parameters())}  # type: ignore[union-attr]
    assert set(got) == set(moments) and all(torch.equal(got[n], moments[n]) for n in moments)
    assert state.step == 4 and state.optimizer.param_groups[0]["lr"] == 0.01  # type: ignore[union-attr]
    # a model with a tensor no stage wrote is refused, naming it
    state2 = TrainState(model=torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(CheckpointCorrupt, match="model key 0.weight"):
        dcpformat.load_restaged(root, 4, 0, state2.capture(only=("model",)), {})


def test_stages_that_share_names_cannot_be_restaged_and_the_restore_says_which_key(tmp_path: Path) -> None:
    """Two stages each a bare Linear wrote ``weight`` under their stage keys: re-cut by name, which one is a
    new stage's is unknowable, so the restore stops rather than load stage 0's weight into every stage."""
    from baft import TrainState

    root, _ = _train(tmp_path, "shared-names")
    model = torch.nn.Linear(8, 8)
    state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
    with pytest.raises(CheckpointCorrupt, match="model key weight was written by several stages"):
        dcpformat.load_restaged(root, 4, 1, state.capture(only=("model", "optimizer")), state.param_names())
