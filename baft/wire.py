"""The node store's wire format: a 4-byte length, a JSON header, then ``nbytes`` bytes of payload.

One request and one reply per message on a TCP connection; ``sealed`` notifications get no reply.
Torch-free (the store process imports only this and the slot file format).
"""
from __future__ import annotations

import json
import socket
import struct
from typing import Any


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    if payload:
        header = {**header, "nbytes": len(payload)}
    raw = json.dumps(header).encode()
    sock.sendall(struct.pack(">I", len(raw)) + raw)
    if payload:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("store connection closed")
        got += k
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    header = json.loads(_recv_exact(sock, n))
    payload = _recv_exact(sock, header["nbytes"]) if header.get("nbytes") else b""
    return header, payload


def request(address: str, header: dict[str, Any], payload: bytes = b"", timeout: float = 30.0) -> tuple[dict[str, Any], bytes]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        send(s, header, payload)
        return recv(s)
