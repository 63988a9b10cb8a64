"""A small, fast, pickle-free encoding of state trees (dicts, lists, tuples, scalars, tensors).

Snapshot metadata is written every iteration, inside the bubbles; ``torch.save``
of a tree of ~1,500 small objects takes ~3 ms here, this ~0.3 ms. Decoding
never executes code: the structure is JSON, the tensors are raw bytes.

Layout: 8-byte little-endian length of the JSON header, the header, then the
tensor bytes. In the header, a tensor is ``{"$t": [dtype, shape, offset, nbytes]}``,
a numpy array ``{"$nd": [dtype, shape, offset, nbytes]}`` and a numpy scalar
(``np.int64(3)``, what a data loader's state often holds) ``{"$np": [dtype, offset,
nbytes]}``, with numpy's dtype string (``<i8``); a tuple ``{"$tuple": [...]}``, and a
dict whose keys are not all strings ``{"$dict": [[key, value], ...]}`` — so ints stay
ints, numpy scalars stay numpy scalars of their dtype and tuples stay tuples (a
fingerprint of the decoded tree equals that of the original). Arrays of Python
objects are refused: their bytes are pointers.
"""
from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import torch


def encode(tree: Any) -> bytes:
    blobs: list[bytes] = []
    offset = 0

    def enc(x: Any) -> Any:
        nonlocal offset
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            spec = [str(t.dtype).removeprefix("torch."), list(t.shape), offset, len(raw)]
            blobs.append(raw)
            offset += len(raw)
            return {"$t": spec}
        if isinstance(x, (np.ndarray, np.generic)):  # before float: np.float64 is a float
            a = np.asarray(x)
            if a.dtype.hasobject:
                raise TypeError(f"cannot encode a numpy {type(x).__name__} of Python objects")
            raw = np.ascontiguousarray(a).tobytes()
            blobs.append(raw)
            spec = [a.dtype.str, list(a.shape), offset, len(raw)]
            offset += len(raw)
            return {"$nd": spec} if isinstance(x, np.ndarray) else {"$np": [spec[0], *spec[2:]]}
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: enc(v) for k, v in x.items()}
            return {"$dict": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"$tuple": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"cannot encode {type(x).__name__}")

    header = json.dumps(enc(tree), separators=(",", ":")).encode()
    return struct.pack("<Q", len(header)) + header + b"".join(blobs)


def decode(data: bytes | memoryview) -> Any:
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(bytes(data[8 : 8 + n]))
    base = 8 + n
    buf = bytes(data[base:])

    def dec(x: Any) -> Any:
        if isinstance(x, dict):
            if "$t" in x and len(x) == 1:
                dtype, shape, off, nbytes = x["$t"]
                raw = bytearray(buf[off : off + nbytes])
                t = torch.frombuffer(raw, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
                return t.view(getattr(torch, dtype)).reshape(shape)
            if "$nd" in x and len(x) == 1:
                dtype, shape, off, nbytes = x["$nd"]
                return np.frombuffer(buf[off : off + nbytes], dtype=np.dtype(dtype)).reshape(shape).copy()
            if "$np" in x and len(x) == 1:
                dtype, off, nbytes = x["$np"]
                return np.frombuffer(buf[off : off + nbytes], dtype=np.dtype(dtype))[0]
            if "$tuple" in x and len(x) == 1:
                return tuple(dec(v) for v in x["$tuple"])
            if "$dict" in x and len(x) == 1:
                return {dec(k): dec(v) for k, v in x["$dict"]}
            return {k: dec(v) for k, v in x.items()}
        if isinstance(x, list):
            return [dec(v) for v in x]
        return x

    return dec(header)
