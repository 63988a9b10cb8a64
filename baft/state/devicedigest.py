"""A tensor's digest and L2 norm computed with torch ops where the tensor lives.

:func:`device_fingerprint` reads a CUDA (or any) tensor on its own device, a few
megabytes at a time, and brings back four numbers: three 42-bit digest lanes and
a float64 sum of squares. Only exact integer ops take part in the digest (int64
multiply, remainder, bitwise and/xor/shift, sum), each kept provably below 2**63,
so the same function gives the same digest for the same bytes on any device: a
CPU run of it is the reference a GPU run is tested against.

The digest. The tensor's bytes (row-major, as its contiguous copy; a complex tensor
as its real pairs) are read as little-endian unsigned 32-bit words ``w_i`` (the last
one zero-padded), and each lane ``l`` of three is
``D_l = H_l + sum_i w_i * t_l[i mod T] * g_l[i div T]  (mod p)``, ``p = 2**42 - 11``
(a prime above every word, so distinct words are distinct residues), where ``H_l``
is a hash of dtype, shape and byte length (blake2b, on the host) reduced mod ``p``,
``t_l`` a table of ``T`` weights in ``[1, 2**31)`` and ``g_l`` a per-block factor in
``[1, 2**21)``, both integer mixes of the word's global index computed on the device.
A product of a word and a table weight stays below ``2**63``; it is reduced mod ``p``
(below ``2**42``) before a row of ``T = 2**16`` of them is summed (below ``2**58``),
reduced again before the block factor multiplies it (below ``2**63``). The lanes,
packed as ``D_0 + D_1 * 2**42 + D_2 * 2**84`` (126 bits), are the 32 hex digits.
The weights depend on the global index only, so the digest does not depend on how
the bytes are cut in pieces.

Why any single flipped bit changes the digest: a flip of bit ``k`` changes exactly
one word by ``d = +-2**k`` with ``0 <= k <= 31`` and leaves dtype, shape and length,
hence ``H_l``, alone; lane ``l`` then changes by ``d * t * g mod p``. Each factor is
nonzero and smaller than the prime ``p`` in absolute value, hence nonzero mod ``p``,
and a product of nonzero residues mod a prime is nonzero: every lane changes. The
same holds for any change confined to one word (``0 < |d| < 2**32 < p``), so two
different flips within one word never give the same digest either. The zero
padding of a last partial word adds nothing to any lane, which is why the byte
length, dtype and shape are hashed into ``H_l``: a 3-byte tensor and a 4-byte one
ending in a zero byte share their words but not their header (they differ unless
the header hashes collide mod ``p`` in all three lanes).

The norm is the float64 sum of squares of the elements (bf16, fp16 and float8
upcast exactly), summed on the device piece by piece: not bit for bit the host
norm of :mod:`baft.state.fingerprint` (which sums float32 blocks), but within
rounding of it, and an inf or a nan anywhere makes it inf or nan as there.
Device memory: temporaries of about ten times ``piece_bytes`` (the int64 words and
their products with three lanes of weights), never the tensor's size.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import torch

#: The lanes' modulus: the largest prime below 2**42 (above 2**32: every 32-bit word is its own residue).
PRIME = (1 << 42) - 11

#: Digest lanes; three 42-bit lanes make the 32 hex digits (126 bits of digest).
LANES = 3
LANE_BITS = 42

#: Words in one row of the weight table. A row's products are reduced below ``PRIME``
#: before they are summed, so a row sum stays below ``TABLE_WORDS * 2**42 = 2**58``.
TABLE_WORDS = 1 << 16

#: Table weights are in ``[1, 2**31)`` (times a word: below 2**63), block factors in
#: ``[1, 2**21)`` (times a residue below 2**42: below 2**63).
_TABLE_WEIGHT_BITS = 31
_BLOCK_WEIGHT_BITS = 21

#: Rows of the table weighed at once: their sum of residues stays below ``2**20 * 2**42 = 2**62``.
_MAX_ROWS = 1 << 20

#: Bytes of a tensor read (and, when it is not contiguous, copied) at a time.
PIECE_BYTES = 8 << 20

_MASK32 = 0xFFFFFFFF
#: Odd multipliers below 2**31, so a 32-bit value times one stays below 2**63.
_MUL1 = 0x7FEB352D
_MUL2 = 0x2C1B3C6D
#: Seeds that keep the lanes', the table's and the block factor's inputs apart.
_TABLE_SEED = 0x3C6EF372
_BLOCK_SEEDS = (0x1B873593, 0x5BD1E995, 0x27D4EB2F)
_HIGH_SEEDS = (0x61C88647, 0x2545F491, 0x4F1BBCDC)

#: Block factors kept per device for the first blocks (tensors up to 4096 table rows, 1 GiB), so a
#: small tensor's digest costs no kernels to mix them.
_CACHED_BLOCKS = 4096

#: Per device, built there at its first use: the weight table, the block factor's two seed rows and the
#: first blocks' factors.
_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of 32-bit values (int64 tensors in ``[0, 2**32)``), with products below 2**63."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _MASK32
    return x ^ (x >> 16)


def _to_weight(x: torch.Tensor, bits: int) -> torch.Tensor:
    """32-bit values as weight factors in ``[1, 2**bits)`` (nonzero, and below the prime)."""
    return x.remainder_((1 << bits) - 1).add_(1)


def _constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """On ``device``: the weight table ``(LANES, TABLE_WORDS)``, ``t_l[j]`` the mix of ``l * TABLE_WORDS + j``
    (distinct inputs); the two ``(LANES,)`` seed rows of the block factor; the factors of the first
    :data:`_CACHED_BLOCKS` blocks."""
    consts = _TABLES.get(device)
    if consts is None:
        index = torch.arange(LANES * TABLE_WORDS, dtype=torch.int64, device=device)
        table = _to_weight(_mix32(index ^ _TABLE_SEED), _TABLE_WEIGHT_BITS).view(LANES, TABLE_WORDS)
        seeds = torch.tensor([_BLOCK_SEEDS, _HIGH_SEEDS], dtype=torch.int64, device=device)
        first = _mix_blocks(torch.arange(_CACHED_BLOCKS, dtype=torch.int64, device=device), seeds[0], seeds[1])
        consts = _TABLES[device] = (table, seeds[0], seeds[1], first)
    return consts


def _mix_blocks(blocks: torch.Tensor, lane_seeds: torch.Tensor, high_seeds: torch.Tensor) -> torch.Tensor:
    """``(len(blocks), LANES)`` int64: the factors ``g_l[b]`` of block indices ``b`` (below 2**63)."""
    blocks = blocks.unsqueeze(1)
    mixed = _mix32((blocks & _MASK32) ^ lane_seeds)
    return _to_weight(_mix32(mixed ^ (blocks >> 32) ^ high_seeds), _BLOCK_WEIGHT_BITS)  # blocks >> 32 < 2**31


def _block_factors(first: int, count: int, device: torch.device) -> torch.Tensor:
    """``(count, LANES)`` int64: ``g_l[b]`` of blocks ``first .. first + count - 1``."""
    _, lane_seeds, high_seeds, cached = _constants(device)
    if first + count <= cached.shape[0]:
        return cached[first:first + count]
    return _mix_blocks(torch.arange(first, first + count, dtype=torch.int64, device=device), lane_seeds, high_seeds)


def _header(t: torch.Tensor, nbytes: int) -> list[int]:
    """``H_l``: dtype, shape and byte length as three residues (host arithmetic, the same everywhere)."""
    text = f"devicedigest/1 {t.dtype} {tuple(t.shape)} {nbytes}".encode()
    raw = hashlib.blake2b(text, digest_size=8 * LANES).digest()
    return [int.from_bytes(raw[8 * i:8 * i + 8], "little") % PRIME for i in range(LANES)]


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


class _Stream:
    """The lanes and the sum of squares of one tensor, accumulated on its device from word-aligned pieces."""

    def __init__(self, t: torch.Tensor, with_norm: bool) -> None:
        self.device = t.device
        self.dtype = t.dtype
        self.table = _constants(t.device)[0]
        self.lanes = torch.zeros(LANES, dtype=torch.int64, device=t.device)
        self.sumsq = (torch.zeros((), dtype=torch.float64, device=t.device)
                      if with_norm and t.is_floating_point() else None)
        self.word = 0  # global index of the next word

    def words(self, data: torch.Tensor) -> None:
        """Add the bytes ``data`` (uint8, contiguous, 4-byte aligned) as the next words.

        A length that is not a multiple of four is the tensor's last piece: its tail
        word is zero-padded.
        """
        whole = data.numel() // 4 * 4
        if whole:
            self._add_words(data[:whole].view(torch.int32).to(torch.int64).bitwise_and_(_MASK32))
        if whole < data.numel():
            tail = torch.zeros(4, dtype=torch.uint8, device=self.device)
            tail[:data.numel() - whole] = data[whole:]
            self._add_words(tail.view(torch.int32).to(torch.int64).bitwise_and_(_MASK32))

    def _add_words(self, w: torch.Tensor) -> None:
        """``w``: int64 words in ``[0, 2**32)``, the ones at global indices ``self.word ..``."""
        pos, m = 0, w.numel()
        while pos < m:
            block, j = divmod(self.word + pos, TABLE_WORDS)
            if j == 0 and m - pos >= TABLE_WORDS:  # whole rows of the table
                rows, length = min((m - pos) // TABLE_WORDS, _MAX_ROWS), TABLE_WORDS
            else:  # the part of one row up to its end, or to the end of the words
                rows, length = 1, min(TABLE_WORDS - j, m - pos)
            seg = w[pos:pos + rows * length].view(rows, 1, length)
            prod = seg * self.table[:, j:j + length]  # (rows, LANES, length): each < 2**32 * 2**31
            sums = prod.remainder_(PRIME).sum(-1).remainder_(PRIME)  # (rows, LANES): row sums < 2**58
            weighted = sums.mul_(_block_factors(block, rows, self.device)).remainder_(PRIME)  # < 2**63 before
            self.lanes.add_(weighted.sum(0)).remainder_(PRIME)  # at most 2**20 rows: < 2**62
            pos += rows * length
        self.word += m

    def squares(self, x: torch.Tensor) -> None:
        """Add the float64 squares of the elements of ``x`` (a piece of the tensor, in its dtype)."""
        if self.sumsq is not None and x.numel():
            x64 = x.to(torch.float64, copy=True)  # a copy even of a float64 piece: squared in place below
            self.sumsq.add_(x64.mul_(x64).sum())

    def finish(self, header: list[int]) -> tuple[str, float | None]:
        """One transfer from the device: the lanes (exact in float64, < 2**42) and the sum of squares."""
        parts = [self.lanes.to(torch.float64)]
        if self.sumsq is not None:
            parts.append(self.sumsq.view(1))
        values = torch.cat(parts).tolist()
        lanes = [(h + int(v)) % PRIME for h, v in zip(header, values[:LANES])]
        digest = f"{sum(v << (LANE_BITS * i) for i, v in enumerate(lanes)):032x}"
        return digest, (math.sqrt(values[LANES]) if self.sumsq is not None else None)


def _row_major_pieces(t: torch.Tensor, limit: int) -> Iterator[torch.Tensor]:
    """Sub-tensors of ``t`` in row-major order, each at most ``limit`` bytes where an element allows."""
    size = t.element_size()
    if t.dim() == 0 or t.numel() * size <= limit:
        yield t
    elif t.dim() == 1:
        step = max(1, limit // size)
        for i in range(0, t.shape[0], step):
            yield t[i:i + step]
    else:
        row = t[0].numel() * size
        if row <= limit:
            rows = max(1, limit // row)
            for i in range(0, t.shape[0], rows):
                yield t[i:i + rows]
        else:
            for i in range(t.shape[0]):
                yield from _row_major_pieces(t[i], limit)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor | None:
    """A contiguous tensor's bytes as a uint8 view starting on a 4-byte boundary, or None if it cannot be one."""
    flat = t.reshape(-1)
    if flat.numel() > 1 and flat.stride(0) != 1:  # a size-1 dimension may keep any stride; the bytes are dense
        flat = flat.as_strided((flat.numel(),), (1,))
    if flat.storage_offset() * flat.element_size() % 4:
        return None
    try:
        return flat.view(torch.uint8)
    except RuntimeError:  # a dtype that has no byte view
        return None


def _feed_in_place(stream: _Stream, data: torch.Tensor, dtype: torch.dtype, size: int, piece_bytes: int) -> None:
    """A contiguous, aligned tensor read where it lies, ``piece_bytes`` (rounded to whole words and elements) at a time."""
    unit = _lcm(4, size)
    step = max(unit, piece_bytes // unit * unit)
    for start in range(0, data.numel(), step):
        piece = data[start:start + step]
        stream.words(piece)
        if stream.sumsq is not None:
            stream.squares(piece.view(dtype))


def _feed_staged(stream: _Stream, t: torch.Tensor, piece_bytes: int) -> None:
    """A non-contiguous (or misaligned) tensor copied on its device into one reused buffer, piece by piece.

    The buffer holds at most ``piece_bytes`` (at least one element) plus the up to three
    bytes of a partial word carried over to the front for the next piece.
    """
    size = t.element_size()
    limit = max(size, piece_bytes)
    buffer = torch.empty(limit + 4, dtype=torch.uint8, device=t.device)
    fill = 0  # bytes in the buffer; always a multiple of gcd(4, element size), so the views below align
    for piece in _row_major_pieces(t, limit):
        nbytes = piece.numel() * size
        if fill + nbytes > limit + 4:
            whole = fill // 4 * 4
            stream.words(buffer[:whole])
            carry = buffer[whole:fill].clone()
            buffer[:carry.numel()] = carry
            fill = carry.numel()
        buffer[fill:fill + nbytes].view(t.dtype).view(piece.shape).copy_(piece)
        stream.squares(piece)
        fill += nbytes
    stream.words(buffer[:fill])


def device_fingerprint(t: torch.Tensor, with_norm: bool = True, piece_bytes: int = PIECE_BYTES) -> tuple[str, float | None]:
    """A 32-hex-digit digest of ``t``'s dtype, shape and bytes, computed where ``t`` lives, and its L2 norm.

    The norm is None unless ``t`` is floating and ``with_norm`` is true. The digest is
    the same on every device for the same bytes, whatever ``piece_bytes`` is (the
    bytes read at a time; device temporaries are about ten times that) and whatever
    ``t``'s strides are (a non-contiguous tensor gets its contiguous copy's digest).
    Conjugate and negative views are resolved first, as :mod:`baft.state.fingerprint` does.
    """
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes must be >= 1, got {piece_bytes}")
    t = t.detach().resolve_conj().resolve_neg()
    nbytes = t.numel() * t.element_size()
    stream = _Stream(t, with_norm)
    if nbytes:
        data = _flat_bytes(t) if t.is_contiguous() else None
        if data is not None:
            _feed_in_place(stream, data, t.dtype, t.element_size(), piece_bytes)
        else:
            _feed_staged(stream, t, piece_bytes)
    return stream.finish(_header(t, nbytes))
