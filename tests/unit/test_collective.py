"""baft.mesh.collective: every rank's few ints, or a small object, in one fixed-size collective."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from baft.mesh import collective
from baft.mesh.collective import all_gather_ints, all_max

from tests.gloo_ranks import run_ranks


def test_without_a_process_group_it_is_the_values_and_it_refuses_what_does_not_fit() -> None:
    assert all_gather_ints([3, 5], 3) == [[3, 5]]
    with pytest.raises(ValueError, match="at most 2 non-negative ints"):
        all_gather_ints([1, 2, 3], 2)
    with pytest.raises(ValueError, match="non-negative"):
        all_gather_ints([-1], 2)


RANK = """
import json, os, sys
import torch.distributed as dist
from baft.mesh import collective
from baft.mesh.collective import all_gather, all_gather_ints, all_max
dist.init_process_group("gloo")
rank = dist.get_rank()
got = all_gather_ints([[4, 7, 9], [], [0]][rank], 3)
largest = all_max([[0.5, -1.0], [2.25, -3.0], [1.0, 0.125]][rank])
calls = []
real = dist.all_gather_object
dist.all_gather_object = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
small = all_gather([None, {"rank": 1}, "x" * collective.SMALL_OBJECT][rank] if rank < 2 else "z")
general = len(calls)
large = all_gather(["a", "b" * (collective.SMALL_OBJECT + 1), None][rank])  # one rank's does not fit: every rank's
with open(os.path.join(sys.argv[1], f"{rank}.json"), "w") as f:
    json.dump([got, largest, small, general, [len(x or "") for x in large], len(calls)], f)
dist.destroy_process_group()
"""


def test_three_ranks_each_get_every_ranks_values_even_none(tmp_path: Path) -> None:
    results = run_ranks(RANK, str(tmp_path), world=3)
    assert all(code == 0 for code, _ in results), [out[-2000:] for _, out in results]
    for rank in range(3):
        got, largest, small, general, large, calls = json.loads((tmp_path / f"{rank}.json").read_text())
        assert [got, largest] == [[[4, 7, 9], [], [0]], [2.25, 0.125]]
        assert small == [None, {"rank": 1}, "z"] and general == 0  # one fixed-size collective
        assert large == [1, collective.SMALL_OBJECT + 1, 0] and calls == 1  # torch's path, on every rank
    assert all_max([1.5, -2.0]) == [1.5, -2.0]  # without a process group: the values
