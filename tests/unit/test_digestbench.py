"""The digest benchmark's result structure on a tiny state (no timing is asserted)."""
from __future__ import annotations

import pytest
import torch

from harness.bench.digest import digest_benchmark, digest_table
from harness.errors import ConfigValueError


def test_tiny_benchmark_reports_every_method() -> None:
    threads = torch.get_num_threads()
    result = digest_benchmark(0.01, tensors=4, repeats=2)
    assert torch.get_num_threads() == threads  # restored after timing on one thread
    assert result["threads"] == 1 and result["tensors"] == 4 and result["repeats"] == 2
    assert result["consistent"] is True
    assert abs(result["bytes"] - 0.01e9) < 4 * 4 * 1024  # rounded to whole rows of 1024 floats per tensor
    assert set(result["methods"]) == {"xxh3-128 digests + norms", "xxh3-128 digests", "blake2b digests (before)"}
    for m in result["methods"].values():
        assert len(m["runs"]) == 2 and m["seconds"] > 0 and m["gb_per_s"] > 0
        assert m["gb_per_s"] == pytest.approx(result["bytes"] / 1e9 / m["seconds"])
    assert result["speedup"] > 0
    table = digest_table(result)
    assert all(name in table for name in result["methods"]) and "WARNING" not in table


@pytest.mark.parametrize("kwargs", [{"gigabytes": 0}, {"gigabytes": 0.01, "tensors": 0}, {"gigabytes": 0.01, "repeats": 0}])
def test_bad_sizes_are_refused(kwargs: dict) -> None:
    with pytest.raises(ConfigValueError):
        digest_benchmark(**kwargs)
