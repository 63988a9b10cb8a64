"""The launch's CPU control groups (issue 55): each node's agent and store in one group, the store idle in it
(at ``lowest``; ``adaptive``: idle while its replicas keep up; ``idle``, the default: a session of its own)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.journal import JournalWriter, launcher_journal, read_events
from harness.run.cpugroups import SWITCH_VARIABLE, CpuGroups, own_cpu_group

V1_MOUNTS = """\
30 24 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:12 - cgroup cgroup rw,cpu
31 24 0:27 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory
"""
V2_MOUNTS = "29 24 0:25 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_cpu_group_of_this_process_is_found_under_either_version(tmp_path: Path) -> None:
    mounts, mine = tmp_path / "mountinfo", tmp_path / "cgroup"
    mounts.write_text(V1_MOUNTS)
    mine.write_text("4:memory:/job\n1:cpu:/pods/p1\n0::/\n")
    assert own_cpu_group(str(mounts), str(mine)) == (Path("/sys/fs/cgroup/cpu/pods/p1"), 1, "")
    # v2: the group is used only where its cgroup.controllers lists cpu
    root = tmp_path / "unified"
    (root / "user.slice").mkdir(parents=True)
    (root / "user.slice" / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mounts.write_text(V2_MOUNTS.replace("/sys/fs/cgroup", str(root)))
    mine.write_text("0::/user.slice\n")
    assert own_cpu_group(str(mounts), str(mine)) == (root / "user.slice", 2, "")
    (root / "user.slice" / "cgroup.controllers").write_text("memory pids\n")
    got, _, why = own_cpu_group(str(mounts), str(mine))
    assert got is None and "no cpu controller" in why
    assert own_cpu_group(str(tmp_path / "absent"), str(mine))[2].startswith("no control groups here")


def _events(run: Path) -> list[dict]:
    return [e for e in read_events(launcher_journal(run)) if e["event"] == "cpu_groups"]


def test_switched_off_no_group_is_made_and_the_journal_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH_VARIABLE, "0")
    journal = JournalWriter(launcher_journal(tmp_path))
    groups = CpuGroups("t" * 32, 2, journal)
    journal.close()
    assert not groups.active and groups.env(0, "store") == {}
    (e,) = _events(tmp_path)
    assert e["path"] is None and e["refused"] == f"switched off ({SWITCH_VARIABLE}=0)"


def test_a_lowest_store_joins_its_idle_group_beside_the_nodes_job_and_the_groups_go_at_the_end(tmp_path: Path) -> None:
    """Where this process may make groups (root, a cpu controller), for real; elsewhere the refusal is journaled."""
    journal = JournalWriter(launcher_journal(tmp_path))
    groups = CpuGroups(os.urandom(16).hex(), 2, journal)
    journal.close()
    (e,) = _events(tmp_path)
    if not groups.active:
        assert e["path"] is None and e["refused"], e  # said, not assumed
        assert groups.env(1, "job") == {}
        return
    try:
        assert e["refused"] is None
        env = groups.env(1, "store")
        (path,) = env.values()
        assert path.endswith("/node1/store")
        # a store applies its priority first thing: at lowest it moves itself into the group it was given and marks
        # it idle; the governor's lowering and raising (adaptive) then set that group, not an autogroup
        code = ("import os, sys\nfrom baft.priority import apply, in_root_cpu_group, set_group_nice\n"
                "a = apply(sys.argv[1])\nprint(a.group, in_root_cpu_group(), a.note or '-')\n"
                "print(open(os.path.join(os.environ['BAFT_CPU_GROUP'], 'cpu.idle')).read().strip())\n"
                "print(set_group_nice(0) or 'raised', open(os.path.join(os.environ['BAFT_CPU_GROUP'], "
                "'cpu.idle')).read().strip())\nprint(open('/proc/self/cgroup').read())")
        out = subprocess.run([sys.executable, "-c", code, "lowest"], env={**os.environ, **env}, capture_output=True,
                             text=True, check=True).stdout
        lines = out.splitlines()
        assert lines[0] == f"cgroup {path} idle False -", out  # out of the autogroups
        assert lines[1] == "1" and lines[2] == "raised 0", out
        rel = path.split("/sys/fs/cgroup/cpu", 1)[-1] if "/sys/fs/cgroup/cpu" in path else path
        assert any(line.endswith(rel) for line in lines[3:]), out
        # at the default, idle, the store stays where it was started (its own session's group)
        code = "from baft.priority import apply\nprint(apply('idle').group or '-')"
        assert subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                              check=True).stdout.strip() == "-"
    finally:
        groups.close()
    assert groups.dirs == [] and not Path(path).exists() and groups.base is not None and not groups.base.exists()


def test_an_agent_takes_its_group_out_of_the_environment_its_ranks_inherit(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in the bench: the floor replicator (a rank's child) applying ``lowest`` found the node's job group in its
    environment and marked the ranks' own group idle."""
    from baft.priority import CPU_GROUP_VARIABLE

    from harness.run.agent import join_node_group

    monkeypatch.setenv(CPU_GROUP_VARIABLE, str(tmp_path / "not-a-group"))
    assert "refused" in join_node_group()  # (not a control group here: the autogroups decide)
    assert CPU_GROUP_VARIABLE not in os.environ
    child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({CPU_GROUP_VARIABLE!r}, '-'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert child == "-"
    assert join_node_group() == "no group named"
