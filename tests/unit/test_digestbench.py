"""The digest benchmark's arithmetic on a tiny state, timed by a fake clock (no real timing is asserted)."""
from __future__ import annotations

import statistics
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.bench import digest
from harness.bench.digest import digest_benchmark, digest_table
from harness.errors import ConfigValueError

#: Seconds each timed pass "takes" on the fake clock, per method, pass after pass.
PASSES = {"probe": [0.5, 0.9, 0.4], "plain": [0.3, 0.2, 0.25], "blake2b": [2.0, 2.2, 1.0]}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The benchmark's clock only moves while a method runs, by that method's next entry of PASSES."""
    fake = {"now": 0.0, "calls": {name: 0 for name in PASSES}}
    monkeypatch.setattr(digest, "time", SimpleNamespace(perf_counter=lambda: fake["now"]))
    real_fingerprint, real_blake2b = digest.fingerprint_components, digest._blake2b_digests

    def advance(name: str) -> None:
        k = fake["calls"][name]
        fake["now"] += PASSES[name][k % len(PASSES[name])]
        fake["calls"][name] = k + 1

    def fingerprint(state: Any, *args: Any, with_norms: bool = True, **kw: Any) -> Any:
        advance("probe" if with_norms else "plain")
        return real_fingerprint(state, *args, with_norms=with_norms, **kw)

    def blake2b(state: Any) -> Any:
        advance("blake2b")
        return real_blake2b(state)

    monkeypatch.setattr(digest, "fingerprint_components", fingerprint)
    monkeypatch.setattr(digest, "_blake2b_digests", blake2b)
    return fake


def test_tiny_benchmark_reports_the_medians_of_its_passes(clock: dict[str, Any]) -> None:
    threads = torch.get_num_threads()
    result = digest_benchmark(0.01, tensors=4, repeats=3)
    assert torch.get_num_threads() == threads  # restored after timing on one thread
    assert result["threads"] == 1 and result["tensors"] == 4 and result["repeats"] == 3
    assert result["consistent"] is True
    rows = round(0.01e9 / 4 / (4 * digest.COLUMNS))
    assert result["bytes"] == 4 * rows * digest.COLUMNS * 4 and result["gigabytes"] == result["bytes"] / 1e9
    # Untimed: the probe's warm-up pass (its first 0.5 s) and the last plain pass (the consistency check).
    expected = {"xxh3-128 digests + norms": [0.9, 0.4, 0.5], "xxh3-128 digests": [0.3, 0.2, 0.25],
                "blake2b digests (before)": [2.0, 2.2, 1.0]}
    assert set(result["methods"]) == set(expected)
    assert clock["calls"] == {"probe": 4, "plain": 4, "blake2b": 3}
    for method, runs in expected.items():
        m = result["methods"][method]
        assert m["runs"] == pytest.approx(runs) and m["seconds"] == pytest.approx(statistics.median(runs))
        assert m["gb_per_s"] == pytest.approx(result["bytes"] / 1e9 / statistics.median(runs))
    assert result["speedup"] == pytest.approx(2.0 / 0.5)  # blake2b's median over the probe's
    table = digest_table(result)
    assert "4.0x faster" in table and all(name in table for name in result["methods"]) and "WARNING" not in table


def test_digests_that_disagree_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """``consistent`` is a check, not a constant: digests that differ between passes are flagged."""
    real = digest.fingerprint_components

    def drifting(state: Any, *args: Any, with_norms: bool = True, **kw: Any) -> Any:
        digests, norms = real(state, *args, with_norms=with_norms, **kw)
        if not with_norms:
            digests["model"]["layers.0.weight"] = "0" * 32
        return digests, norms

    monkeypatch.setattr(digest, "fingerprint_components", drifting)
    result = digest_benchmark(0.001, tensors=2, repeats=1)
    assert result["consistent"] is False and "WARNING" in digest_table(result)


@pytest.mark.parametrize("kwargs", [{"gigabytes": 0}, {"gigabytes": 0.01, "tensors": 0}, {"gigabytes": 0.01, "repeats": 0}])
def test_bad_sizes_are_refused(kwargs: dict) -> None:
    with pytest.raises(ConfigValueError):
        digest_benchmark(**kwargs)
