"""baft.priority: the idle classes, and the autogroup of a process that leads its own session."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from baft import priority


def _autogroups_on() -> bool:
    try:
        with open(priority.AUTOGROUPS) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _group(pid: int) -> tuple[str, int]:
    name, _, nice = open(f"/proc/{pid}/autogroup").read().split()
    return name, int(nice)


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="a kernel without autogroups")
def test_a_session_leaders_group_goes_to_the_lowest_weight_and_a_shared_group_is_left() -> None:
    """With autogroups on, the scheduler shares a core between sessions' groups before it looks at a thread's
    class: a node store (its own session) in SCHED_IDLE still competes as a normal process. ``lowest`` gives its
    group nice 19 (``idle`` leaves it); a child in this process's session (a writer) keeps the group it shares
    with its parent."""
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mine = _group(os.getpid())
    try:
        assert priority.apply(priority.IDLE, leader.pid).group == "" and _group(leader.pid)[1] == 0  # the class only
        led, shared = priority.apply(priority.LOWEST, leader.pid), priority.apply(priority.LOWEST, member.pid)
        assert os.sched_getscheduler(leader.pid) == os.SCHED_IDLE == os.sched_getscheduler(member.pid)
        assert _group(member.pid) == mine and shared.group == ""  # training's group is never touched
        if _autogroups_on():
            assert _group(leader.pid)[1] == 19 and _group(leader.pid)[0] != mine[0]
            assert led.group == "autogroup nice 19" and led.fields()["cpu_group"] == "autogroup nice 19"
        else:
            assert led.group == "" and _group(leader.pid)[1] == 0
        assert priority.apply(priority.NORMAL, leader.pid).group == ""
    finally:
        for p in (leader, member):
            p.kill()
            p.wait()


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="a kernel without autogroups")
def test_adaptive_leaves_a_leaders_group_at_nice_0_for_its_governor_and_a_members_alone() -> None:
    """``adaptive`` (a choice of the store's): the idle classes, a session leader's group at nice 0 and marked as the
    governor's (:class:`baft.store.governor.GroupGovernor` lowers and raises it through ``set_group_nice``); a
    process in its parent's session gets the classes only."""
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mine = _group(os.getpid())
    try:
        priority.set_group_nice(7, leader.pid)
        led, shared = priority.apply(priority.ADAPTIVE, leader.pid), priority.apply(priority.ADAPTIVE, member.pid)
        assert os.sched_getscheduler(leader.pid) == os.SCHED_IDLE == os.sched_getscheduler(member.pid)
        assert shared.group == "" and _group(member.pid) == mine
        assert priority.set_group_nice(19, member.pid) == "" and _group(member.pid) == mine  # never a shared group
        if _autogroups_on():
            assert led.group == priority.ADAPTIVE_GROUP and led.fields()["cpu_group"] == priority.ADAPTIVE_GROUP and _group(leader.pid)[1] == 0
            assert priority.set_group_nice(priority.GROUP_LOW, leader.pid) == "" and _group(leader.pid)[1] == 19
        else:
            assert led.group == "" and not priority.leads_group(leader.pid)
    finally:
        for p in (leader, member):
            p.kill()
            p.wait()
    with pytest.raises(ValueError, match="adaptive, idle, lowest or normal"):
        priority.apply("background")
