"""The device digest (baft.state.devicedigest): one function, the same digest for the same bytes on any
device. Run here on the CPU: equal bytes give equal digests, any flipped bit, dtype or shape changes them,
the piece size and the strides do not; the norms agree with the host fingerprint's; non-CPU tensors are
routed to it. The CUDA test compares a GPU's digest with this CPU's."""
from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baft.state import devicedigest as dd
from baft.state import fingerprint as fp_mod
from baft.state.devicedigest import PRIME, device_fingerprint
from baft.state.fingerprint import fingerprint_components, fingerprint_leaf

from harness.bench.digest import DEVICE_METHOD, digest_benchmark, digest_table

#: Dtypes whose every bit pattern is a valid value (1, 2, 4, 8 and 16 bytes wide).
BYTE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
               torch.int8, torch.uint8, torch.complex64, torch.complex128]
FLOAT8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, *FLOAT8]


def from_bytes(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A tensor over a fresh copy of ``raw``, as ``dtype`` and ``shape`` (1-D by default)."""
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    t = t.view(dtype)
    return t.reshape(shape) if shape is not None else t


def random_bytes(nbytes: int, seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    return bytes(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).tolist())


def random_tensor(dtype: torch.dtype, numel: int, seed: int) -> torch.Tensor:
    """Uniformly random bytes: NaNs, infinities and subnormals included."""
    return from_bytes(random_bytes(numel * dtype.itemsize, seed), dtype)


def digest(t: torch.Tensor, **kw: int) -> str:
    return device_fingerprint(t, with_norm=False, **kw)[0]


@contextlib.contextmanager
def small_table(words: int) -> Iterator[None]:
    """A weight table of ``words`` words, so small tensors cross many blocks (the digest is another function
    then; the properties are the same)."""
    old_words, old_tables = dd.TABLE_WORDS, dd._TABLES
    dd.TABLE_WORDS, dd._TABLES = words, {}
    try:
        yield
    finally:
        dd.TABLE_WORDS, dd._TABLES = old_words, old_tables


# --- the digest: a fixed function of dtype, shape and bytes ---------------------------------------------

def test_digest_is_32_hex_digits_and_a_fixed_function() -> None:
    """Pinned values: a change to the function (it is compared across devices and runs) must be deliberate."""
    d = digest(torch.arange(10, dtype=torch.int32))
    assert re.fullmatch(r"[0-9a-f]{32}", d), d
    value = int(d, 16)
    assert all((value >> (dd.LANE_BITS * i)) % (1 << dd.LANE_BITS) < PRIME for i in range(dd.LANES))
    assert value >> (dd.LANE_BITS * dd.LANES) == 0  # three residues, 126 bits
    assert d == PINNED_ARANGE
    assert digest(torch.linspace(-1, 1, 7, dtype=torch.float64).reshape(7, 1)) == PINNED_LINSPACE


PINNED_ARANGE = "2323f58abc6604115d4cdc9553330ccc"
PINNED_LINSPACE = "3dc7bf77dd652e3880f0e5b8f2ae7690"


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(BYTE_DTYPES), numel=st.integers(0, 300), seed=st.integers(0, 2**16))
def test_equal_bytes_equal_digests(dtype: torch.dtype, numel: int, seed: int) -> None:
    raw = random_bytes(numel * dtype.itemsize, seed)
    a, b = from_bytes(raw, dtype), from_bytes(raw, dtype)  # two buffers, the same bytes
    assert a.data_ptr() != b.data_ptr() or numel == 0
    assert device_fingerprint(a)[0] == device_fingerprint(b)[0]


@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from(BYTE_DTYPES), numel=st.integers(1, 300), seed=st.integers(0, 2**16), data=st.data())
def test_any_flipped_bit_changes_the_digest(dtype: torch.dtype, numel: int, seed: int, data: st.DataObject) -> None:
    raw = bytearray(random_bytes(numel * dtype.itemsize, seed))
    before = digest(from_bytes(bytes(raw), dtype))
    bit = data.draw(st.integers(0, 8 * len(raw) - 1), label="bit")
    raw[bit // 8] ^= 1 << (bit % 8)
    assert digest(from_bytes(bytes(raw), dtype)) != before


@pytest.mark.parametrize("nbytes", [1, 2, 3, 5, 6, 7, 9, 13])
def test_every_bit_of_a_last_partial_word_counts(nbytes: int) -> None:
    """The zero-padded tail word is hashed like any other: each of its bits, and the full words before it."""
    raw = random_bytes(nbytes, nbytes)
    before = digest(from_bytes(raw, torch.uint8))
    seen = {before}
    for bit in range(8 * nbytes):
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        seen.add(digest(from_bytes(bytes(flipped), torch.uint8)))
    assert len(seen) == 8 * nbytes + 1  # every flip its own digest


@settings(max_examples=30, deadline=None)
@given(numel=st.integers(1, 64), seed=st.integers(0, 2**16), data=st.data())
def test_dtype_and_shape_are_part_of_the_digest(numel: int, seed: int, data: st.DataObject) -> None:
    t = random_tensor(torch.int32, numel, seed)
    assert digest(t) != digest(t.view(torch.float32))  # the same bytes as another dtype
    assert digest(t) != digest(t.view(torch.uint8))
    assert digest(t) != digest(t.view(torch.int16))
    rows = data.draw(st.sampled_from([d for d in range(1, numel + 1) if numel % d == 0]), label="rows")
    assert digest(t) != digest(t.reshape(rows, numel // rows, 1))  # the same bytes in another shape
    if numel > 1:
        assert digest(t.reshape(1, numel)) != digest(t.reshape(numel, 1))


@settings(max_examples=40, deadline=None)
@given(words=st.integers(2, 40), data=st.data(), table_words=st.sampled_from([1, 2, 4, 8]))
def test_where_a_word_lies_is_part_of_the_digest(words: int, data: st.DataObject, table_words: int) -> None:
    """One nonzero word at two places: the weights differ with the index, in the table row and across rows
    (a small table puts the places in different rows, where only the block factor tells them apart)."""
    i = data.draw(st.integers(0, words - 1), label="i")
    j = data.draw(st.integers(0, words - 1).filter(lambda k: k != i), label="j")
    value = data.draw(st.integers(1, 2**32 - 1), label="value")
    a, b = torch.zeros(words, dtype=torch.int64), torch.zeros(words, dtype=torch.int64)
    a[i], b[j] = value, value
    with small_table(table_words):
        assert digest(a.to(torch.int32)) != digest(b.to(torch.int32))
        rows = torch.arange(2 * table_words, dtype=torch.int32).view(2, table_words) + 1
        assert digest(rows) != digest(rows.flip(0).contiguous())  # two table rows swapped


def test_zero_padding_does_not_collide_with_a_longer_tensor() -> None:
    """3 bytes padded to a word equal 4 bytes ending in zero as words; the header tells them apart."""
    assert digest(from_bytes(b"\x01\x02\x03", torch.uint8)) != digest(from_bytes(b"\x01\x02\x03\x00", torch.uint8))
    assert digest(torch.zeros(5, dtype=torch.uint8)) != digest(torch.zeros(8, dtype=torch.uint8))
    assert digest(torch.zeros(1, dtype=torch.int16)) != digest(torch.zeros(2, dtype=torch.uint8))
    assert digest(torch.zeros(0)) != digest(torch.zeros(0, 3)) != digest(torch.zeros(0, dtype=torch.int32))
    assert digest(torch.tensor(2.0)) != digest(torch.tensor([2.0]))  # 0-dim against one element


# --- pieces and strides ----------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(BYTE_DTYPES), numel=st.integers(0, 200), seed=st.integers(0, 2**16),
       piece_bytes=st.integers(1, 200), table_words=st.sampled_from([1, 3, 8, 64]))
def test_digest_does_not_depend_on_the_piece_size(dtype: torch.dtype, numel: int, seed: int, piece_bytes: int,
                                                 table_words: int) -> None:
    """With a small table the pieces start and end at every position of its rows and span many rows."""
    t = random_tensor(dtype, numel, seed)
    with small_table(table_words):
        assert digest(t, piece_bytes=piece_bytes) == digest(t, piece_bytes=1 << 20)


def test_piece_size_on_the_real_table() -> None:
    """A tensor of several table rows, cut in pieces that straddle rows."""
    t = random_tensor(torch.float32, 3 * dd.TABLE_WORDS + 5, 7)
    whole = digest(t)
    for piece in (4 * dd.TABLE_WORDS - 12, 4 * dd.TABLE_WORDS + 4, 300_001):
        assert digest(t, piece_bytes=piece) == whole
        assert digest(t[1:], piece_bytes=piece) == digest(t[1:].clone())
    flipped = t.clone()
    flipped.view(torch.int32)[2 * dd.TABLE_WORDS + 1] ^= 1 << 30  # a word of a later row
    assert digest(flipped) != whole


@pytest.mark.parametrize("piece_bytes", [1, 5, 64, 1 << 20])
@settings(max_examples=25, deadline=None)
@given(
    dtype=st.sampled_from(BYTE_DTYPES),
    shape=st.lists(st.integers(1, 12), min_size=2, max_size=3),
    seed=st.integers(0, 2**16),
    how=st.sampled_from(["transpose", "step", "column", "expand", "offset"]),
)
def test_non_contiguous_digest_equals_its_contiguous_copy(
    piece_bytes: int, dtype: torch.dtype, shape: list[int], seed: int, how: str
) -> None:
    """Strided views, and a contiguous view that starts off a word boundary, are copied piece by piece."""
    base = random_tensor(dtype, math.prod(shape) + 1, seed)
    grid = base[:-1].reshape(shape)
    view = {
        "transpose": lambda: grid.transpose(0, -1),
        "step": lambda: grid[::2],
        "column": lambda: grid[..., 1:2] if shape[-1] > 1 else grid.transpose(0, -1),
        "expand": lambda: grid[:1].expand(3, *shape[1:]),
        "offset": lambda: base[1:].reshape(shape),  # contiguous; misaligned unless 4-byte elements or wider
    }[how]()
    got, want = device_fingerprint(view, piece_bytes=piece_bytes), device_fingerprint(view.contiguous())
    assert got[0] == want[0]
    if got[1] is not None:
        assert got[1] == pytest.approx(want[1], rel=1e-12, nan_ok=True)


# --- the norm -----------------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(FLOATS), numel=st.integers(0, 40_000), scale_exp=st.integers(-30, 30),
       seed=st.integers(0, 2**16), piece_bytes=st.sampled_from([64, 4096, 1 << 20]))
def test_norm_agrees_with_the_host_norm(dtype: torch.dtype, numel: int, scale_exp: int, seed: int,
                                        piece_bytes: int) -> None:
    """Float64 on the device: within 1e-12 of the float64 norm; the host norm (float32 blocks) is ~1e-8
    accurate for 1- to 4-byte floats, float64 exact but for rounding."""
    gen = torch.Generator().manual_seed(seed)
    t = (torch.randn(numel, generator=gen, dtype=torch.float64) * 2.0**scale_exp).to(dtype)
    _, norm = device_fingerprint(t, piece_bytes=piece_bytes)
    _, host = fingerprint_leaf(t)
    exact = float(torch.linalg.vector_norm(t.to(torch.float64)))
    assert norm is not None and host is not None
    if math.isnan(exact):  # float8_e4m3fn casts of large noise: NaN on torch 2.11 (2.13 saturates at 448)
        assert math.isnan(norm) and math.isnan(host)
        return
    if math.isinf(exact):  # float16/float8 casts of large noise overflow
        assert norm == host == exact
        return
    assert norm == pytest.approx(exact, rel=1e-12, abs=1e-300)
    assert norm == pytest.approx(host, rel=1e-12 if dtype == torch.float64 else 2e-7, abs=1e-300)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("special", [math.inf, -math.inf, math.nan])
def test_inf_and_nan_norms_like_the_host(dtype: torch.dtype, special: float) -> None:
    t = torch.tensor([1.0, special, 2.0]).to(dtype)
    norm, host = device_fingerprint(t)[1], fingerprint_leaf(t)[1]
    assert norm is not None and host is not None
    assert (math.isnan(norm) and math.isnan(host)) if math.isnan(special) else norm == host == math.inf
    both = torch.tensor([math.inf, math.nan]).to(dtype)
    assert math.isnan(device_fingerprint(both)[1] or 0.0) and math.isnan(fingerprint_leaf(both)[1] or 0.0)


def test_huge_floats_overflow_like_the_host() -> None:
    big64 = torch.tensor([1e200, 1.0], dtype=torch.float64)  # its square overflows float64
    assert device_fingerprint(big64)[1] == fingerprint_leaf(big64)[1] == math.inf
    big32 = torch.tensor([3e38, 3e38])  # squares overflow float32, not float64
    assert device_fingerprint(big32)[1] == pytest.approx(fingerprint_leaf(big32)[1], rel=1e-12)


def test_norm_only_for_floating_tensors_and_when_asked() -> None:
    for t in (torch.arange(5), torch.ones(3, dtype=torch.bool), torch.ones(2, dtype=torch.complex64),
              torch.ones(4, dtype=torch.uint8)):
        assert device_fingerprint(t)[1] is None and fingerprint_leaf(t)[1] is None
    assert device_fingerprint(torch.ones(4), with_norm=False)[1] is None
    assert device_fingerprint(torch.ones(4))[1] == 2.0


def test_empty_and_zero_dim_tensors() -> None:
    assert device_fingerprint(torch.empty(0))[1] == 0.0
    assert device_fingerprint(torch.empty(0, 5, dtype=torch.int8))[1] is None
    assert device_fingerprint(torch.tensor(-3.0))[1] == 3.0
    zero_dim = torch.tensor(7, dtype=torch.int16)
    assert digest(zero_dim) == digest(torch.tensor(7, dtype=torch.int16)) != digest(torch.tensor(6, dtype=torch.int16))


def test_bool_complex_and_lazy_views() -> None:
    """bool and complex are bytes like any other (complex as its real pairs, its dtype still its own);
    conjugate and negative views are resolved first, as the host fingerprint does."""
    flags = torch.tensor([True, False, True])
    assert digest(flags) != digest(torch.tensor([True, True, True]))
    assert digest(flags) != digest(flags.view(torch.uint8))
    c = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    assert digest(c.conj()) == digest(c.conj().resolve_conj()) != digest(c)
    assert digest(c) != digest(torch.view_as_real(c))
    assert digest(c.t(), piece_bytes=8) == digest(c.t().contiguous())
    x = torch.randn(5, generator=torch.Generator().manual_seed(1))
    assert digest(torch.neg(x.conj())) == digest(-x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_tensor_is_left_as_it_was(dtype: torch.dtype) -> None:
    t = torch.randn(1000, generator=torch.Generator().manual_seed(2)).to(dtype)
    copy = t.clone()
    device_fingerprint(t, piece_bytes=512)
    device_fingerprint(t.view(10, 100).t(), piece_bytes=512)
    assert torch.equal(t, copy)


def test_bad_piece_size_is_refused() -> None:
    with pytest.raises(ValueError):
        device_fingerprint(torch.ones(3), piece_bytes=0)


def is_prime(n: int) -> bool:
    """Miller-Rabin with the first twelve primes as bases: exact below 3.3e24."""
    bases = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    if n in bases:
        return True
    if n < 2 or any(n % b == 0 for b in bases):
        return False
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_the_arithmetic_bounds_of_the_flipped_bit_argument() -> None:
    """p is a prime above every 32-bit word; table weights below 2**31 and block factors below 2**21, none
    zero, for any index (blocks 2**32 apart, a tensor past 16 TiB, get their own factors); no product or
    sum of the digest reaches 2**63."""
    assert is_prime(PRIME) and 2**32 < PRIME < 2**dd.LANE_BITS and not is_prime(PRIME + 2)
    cpu = torch.device("cpu")
    table, _, _, cached = dd._constants(cpu)
    assert int(table.min()) >= 1 and int(table.max()) < 2**dd._TABLE_WEIGHT_BITS
    assert table.unique().numel() > 0.99 * table.numel()  # the lanes' tables are not copies of each other
    for first in (0, 2**31, 2**40, 2**62 - 10):
        g = dd._block_factors(first, 5, torch.device("cpu"))
        assert g.shape == (5, dd.LANES) and int(g.min()) >= 1 and int(g.max()) < 2**dd._BLOCK_WEIGHT_BITS
    assert (2**32 - 1) * (2**dd._TABLE_WEIGHT_BITS - 1) < 2**63  # a word times a table weight
    assert dd.TABLE_WORDS * (PRIME - 1) < 2**63  # a row's residues summed
    assert (PRIME - 1) * (2**dd._BLOCK_WEIGHT_BITS - 1) < 2**63  # a row's residue times its block factor
    assert dd._MAX_ROWS * (PRIME - 1) + PRIME < 2**63  # the rows' residues summed into a lane
    assert not torch.equal(dd._block_factors(3, 1, cpu), dd._block_factors(3 + 2**32, 1, cpu))
    n = cached.shape[0]  # the first blocks' factors are kept, the rest mixed when asked: the same function
    assert torch.equal(dd._block_factors(n - 6, 10, cpu), torch.cat([cached[n - 6:], dd._block_factors(n, 4, cpu)]))


# --- routing in baft.state.fingerprint, and the benchmark ------------------------------------------------

def test_fingerprint_sends_non_cpu_tensors_to_the_device_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``meta`` tensor stands for a GPU's here (no data, so the device digest itself is faked)."""
    calls: list[tuple[torch.device, bool]] = []

    def fake(t: torch.Tensor, with_norm: bool = True, piece_bytes: int = dd.PIECE_BYTES) -> tuple[str, float | None]:
        calls.append((t.device, with_norm))
        return "d" * 32, 1.5 if with_norm else None

    monkeypatch.setattr(fp_mod, "device_fingerprint", fake)
    meta = torch.empty(4, 4, device="meta")
    assert fingerprint_leaf(meta) == ("d" * 32, 1.5)
    digests, norms = fingerprint_components({"model": {"w": meta, "b": torch.ones(3)}})
    assert digests["model"]["w"] == "d" * 32 and norms["model"]["w"] == 1.5
    assert digests["model"]["b"] != "d" * 32  # a CPU tensor keeps xxh3
    fingerprint_components({"model": {"w": meta}}, with_norms=False)
    assert calls == [(torch.device("meta"), True)] * 2 + [(torch.device("meta"), False)]


def test_digest_benchmark_times_the_device_digest() -> None:
    result = digest_benchmark(0.002, tensors=2, repeats=1, device="cpu")
    assert result["device"] == "cpu" and result["device_consistent"] is True
    m = result["methods"][DEVICE_METHOD]
    assert m["gb_per_s"] == pytest.approx(result["bytes"] / 1e9 / m["seconds"])
    assert f"{DEVICE_METHOD} on cpu" in digest_table(result) and "WARNING" not in digest_table(result)
    assert "device" not in digest_benchmark(0.002, tensors=2, repeats=1)  # off unless asked


# --- on a GPU ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_digest_equals_the_cpu_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3_000_000, generator=gen), torch.randn(700, 900, generator=gen).to(torch.bfloat16),
               torch.randn(1000, 800, generator=gen, dtype=torch.float64).t(), torch.arange(10**6),
               torch.randint(0, 256, (1_000_003,), generator=gen, dtype=torch.uint8)[1:],
               torch.tensor(True), torch.randn(33, 3, generator=gen, dtype=torch.complex64), torch.empty(0, 2),
               *(torch.randn(5000, generator=gen).to(d) for d in FLOAT8)]
    for t in tensors:
        cpu = device_fingerprint(t)
        for piece in (1 << 20, dd.PIECE_BYTES):
            cuda = device_fingerprint(t.cuda(), piece_bytes=piece)
            assert cuda[0] == cpu[0], t.dtype
            if cpu[1] is not None:
                assert cuda[1] == pytest.approx(cpu[1], rel=1e-12)
    calls = []
    real = fp_mod.device_fingerprint
    monkeypatch.setattr(fp_mod, "device_fingerprint", lambda t, *a, **kw: calls.append(t.device) or real(t, *a, **kw))
    t = tensors[0]
    assert fingerprint_leaf(t.cuda()) == device_fingerprint(t.cuda())
    assert calls and calls[0].type == "cuda"
