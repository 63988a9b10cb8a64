"""The preempt fault end to end: SIGTERM to a node's agent and workers, the grace, SIGKILL, the node back or gone;
the built-in workload's flush, and a plain script that saves in its SIGTERM handler, with a long and a short grace."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis.journal import Journal
from tests.e2e.conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CI = ROOT / "scenarios" / "ci"
DDP = ROOT / "examples" / "ddp_torchsave"


def launcher_events(run_dir: Path, event: str) -> list[dict]:
    return [e for e in Journal.load(run_dir).launcher if e["event"] == event]


def test_a_preempted_node_flushes_in_its_grace_and_comes_back(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "baft-preempt.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"]
    faulted = tmp_path / "out" / "faulted"
    (sig,) = launcher_events(faulted, "preempt_signal")
    assert sig["node"] == 1 and sig["ranks"] == [2, 3] and len(sig["pids"]) == 2 and sig["step"] == 14
    outcomes = launcher_events(faulted, "preempt_outcome")
    assert {(o["rank"], o["outcome"]) for o in outcomes} == {(2, "ended"), (3, "ended")}
    assert all(o["seconds"] <= 20 for o in outcomes)  # "ended": within the grace (the controller's own rule)
    # every rank (node 0's too: they agree at the boundary) persisted the state after step 14 together
    flushes = Journal.load(faulted).events("preempt_flush")
    assert sorted(f["rank"] for f in flushes) == [0, 1, 2, 3] and {f["persisted"] for f in flushes} == {15}
    assert {f["rank"] for f in flushes if f["signaled"]} >= {2, 3}
    # the node's store and memory went; a new agent joined the same rendezvous
    assert any(e["node"] == "node1" and e["reason"] == "preempted" for e in launcher_events(faulted, "store_lost"))
    starts = launcher_events(faulted, "agent_start")
    assert [s["node"] for s in starts] == ["node0", "node1", "node1"] and starts[2]["reason"] == "preempted"
    rec, = v["recoveries"]
    assert rec["restored_step"] == 15 and rec["restored_tier"] == "persistent" and rec["lost_steps"] == 0
    (p,) = v["preemptions"]
    assert p["ended"] == [2, 3] and p["killed"] == [] and p["flushed"] == 15
    assert p["exit_codes"] == {"2": 143, "3": 143}, p  # the workload's own exit after its flush
    assert "node 1 preempted at step 14 (grace 20 s): ranks 2, 3 exited 143 within" in out


def test_preempting_the_rendezvous_host_restarts_every_agent(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "preempt-rendezvous-host.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["recoveries"][0]["lost_steps"] == 0
    faulted = tmp_path / "out" / "faulted"
    starts = launcher_events(faulted, "agent_start")
    assert [s["node"] for s in starts] == ["node0", "node1", "node0", "node1"]
    port = lambda s: s["cmd"][s["cmd"].index("--rdzv-endpoint") + 1]  # noqa: E731
    assert port(starts[2]) == port(starts[3]) != port(starts[0])  # a new rendezvous, both nodes on it
    assert {f["persisted"] for f in Journal.load(faulted).events("preempt_flush")} == {11}  # sync's flush


def test_a_node_preempted_for_good_leaves_an_elastic_job(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "preempt-elastic.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["world_size"] == {"reference": 4, "final": 2, "sizes": [4, 2]}, v["world_size"]
    rec, = v["recoveries"]
    assert rec["restored_step"] == 13 and rec["lost_steps"] == 0
    faulted = tmp_path / "out" / "faulted"
    assert (faulted / "faults" / "node1.lost").exists()
    assert [s["node"] for s in launcher_events(faulted, "agent_start")] == ["node0", "node1"]  # none came back
    assert "the node stayed gone" in out


def test_a_script_that_saves_on_sigterm_within_its_grace_resumes_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(DDP / "preempt.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec, = v["recoveries"]
    assert rec["restored_step"] == 13 and rec["lost_steps"] == 0
    (p,) = v["preemptions"]
    assert p["ended"] == [0, 1] and p["killed"] == [] and p["exit_codes"] == {"0": 143, "1": 143}, p
    assert "ranks 0, 1 exited 143 within" in out
    log = (tmp_path / "out" / "faulted" / "logs" / "node0.log").read_text()
    assert "rank 0: preempted; saved micro-batch 13 (step 13)" in log


def test_a_script_that_saves_and_exits_0_in_its_grace_is_restarted_all_the_same(tmp_path: Path, ref_cache: Path) -> None:
    """Issue 54: both ranks saved step 13 and exited 0 in the grace; the harness took that for the job's end and
    never brought the node back ("restored step 0 (no checkpoint), lost 13 steps"). A cluster replaces an
    evicted pod whatever its exit code."""
    rc, out, v = run_cli(DDP / "preempt-exit0.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec, = v["recoveries"]
    assert rec["restored_step"] == 13 and rec["lost_steps"] == 0
    (p,) = v["preemptions"]
    assert p["exited_0"] == [0, 1] and p["killed"] == [], p
    assert [s["node"] for s in launcher_events(tmp_path / "out" / "faulted", "agent_start")] == ["node0", "node0"]
    assert "ranks 0, 1 exited 0 within" in out and "the node came back" in out


@pytest.mark.parametrize("variant", ["ignore", "default"])
def test_a_script_that_ignores_sigterm_or_dies_of_it_in_a_collective_is_restarted(
        variant: str, tmp_path: Path, ref_cache: Path) -> None:
    """Issue 54's lifecycles. ``ignore``: the script ignores SIGTERM and trains on in the 2 s grace until it is
    killed; it resumes from its last periodic save, and the steps it trained in the grace past that save are lost
    work. ``default``: no handler; rank 0 fires the fault as it fetches step 12's data and waits for the harness,
    so rank 1 is in step 12's gradient all-reduce, waiting for it, when the signal's default action ends both."""
    rc, out, v = run_cli(DDP / f"preempt-{variant}.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec, = v["recoveries"]
    (p,) = v["preemptions"]
    assert [s["node"] for s in launcher_events(tmp_path / "out" / "faulted", "agent_start")] == ["node0", "node0"]
    assert "the node came back" in out and "exit_codes" not in p and "exited_0" not in p, p
    if variant == "ignore":
        assert p["killed"] == [0, 1] and p["ended"] == [], p
        assert "ranks 0, 1 still alive at the end of the grace: killed" in out
        # trained on past step 12 in the grace; what it had not saved is lost
        assert rec["progress_before"] >= 12 and rec["restored_step"] == 5 * (rec["progress_before"] // 5)
        assert rec["lost_steps"] == rec["progress_before"] - rec["restored_step"]
    else:
        assert p["ended"] == [0, 1] and p["killed"] == [], p
        assert "with no exit of their own (the signal's default action" in out
        assert (rec["progress_before"], rec["restored_step"], rec["lost_steps"]) == (12, 10, 2)


def test_a_grace_shorter_than_the_scripts_save_leaves_a_torn_checkpoint(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(DDP / "preempt-short.yaml", tmp_path / "out", ref_cache)
    assert rc == 1, out
    (p,) = v["preemptions"]
    assert p["killed"] == [0, 1] and p["ended"] == []  # both still in the save (rank 0 writing, rank 1 waiting)
    rec, = v["recoveries"]
    assert rec["restored_step"] == 10
    assert "model equals step 10, but rng equals step 13" in out
    (c,) = v["diagnosis"]  # the RNG files of the new save beside the old last.pt
    assert c["code"] == "torn-checkpoint" and c["evidence"][0] == "rank 0: model equals step 10, rng/torch equals step 13"
    assert "ranks 0, 1 still alive at the end of the grace: killed" in out


def test_two_nodes_preempted_at_once_are_signalled_together(tmp_path: Path, ref_cache: Path) -> None:
    """The second request arrives while the first's grace runs: it is signalled at once too (its worker waits
    for the ack, and its peers' collectives for it), and node 0's restart of every agent leaves node 1 on it."""
    scenario = {"name": "preempt-two-nodes",
                "workload": {"model": "gpt-tiny", "stages": 4, "microbatches": 8, "schedule": "1f1b", "steps": 20,
                             "nodes": 2},
                "checkpoint": {"strategy": "baft", "every": 50},
                "faults": [{"preempt": {"node": 1, "at_step": 10, "grace_s": 8}},
                           {"preempt": {"node": 0, "at_step": 10, "phase": "forward", "grace_s": 8}}],
                "expect": {"bitwise": True, "max_lost_steps": 0}, "run": {"max_restarts": 4}}
    rc, out, v = run_cli(scenario, tmp_path / "out", ref_cache)
    assert rc == 0, out
    faulted = tmp_path / "out" / "faulted"
    signals = launcher_events(faulted, "preempt_signal")
    assert sorted(s["node"] for s in signals) == [0, 1]
    ends = launcher_events(faulted, "preempt_end")
    assert max(s["t"] for s in signals) < min(e["t"] for e in ends)  # both signalled before either grace ended
    assert not launcher_events(faulted, "preempt_error")
    assert all(p["killed"] == [] for p in v["preemptions"])
    last = {}
    for s in launcher_events(faulted, "agent_start"):
        last[s["node"]] = s["cmd"][s["cmd"].index("--rdzv-endpoint") + 1]
    assert last["node0"] == last["node1"]  # the agents that finished the job met on one rendezvous
