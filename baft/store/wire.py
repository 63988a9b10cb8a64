"""The node store's wire format and its handshake.

A connection starts with a mutual proof of the run's secret (HMAC-SHA256 over two fresh nonces; the
secret itself never crosses the wire): the store sends ``{"nonce": S}``, the client answers
``{"nonce": C, "proof": HMAC(secret, "client" S C)}``, the store answers ``{"proof": HMAC(secret,
"server" C S)}``. A peer that cannot prove it is refused before any request is read, and a client
never takes data from a store that cannot prove it either (a restore writes what a store sends into
a worker's slot).

Then messages: a 4-byte big-endian length, a JSON object (at most :data:`MAX_HEADER` bytes), then
``nbytes`` bytes of payload when the header says so. One request and one reply per message on a
connection; ``sealed`` notifications get no reply. The traffic is authenticated, not encrypted.
Torch-free (the store process imports only this and the slot file format).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
from typing import Any

#: The environment variable that holds the run's store secret (workers and stores alike; a Secret in a
#: cluster). Never a command-line argument: those are visible to every user of the machine.
SECRET_VARIABLE = "BAFT_STORE_SECRET"
#: The largest JSON header accepted (a request's header is a few hundred bytes).
MAX_HEADER = 64 << 10
#: Seconds a peer has to complete the handshake, and to deliver the rest of a message once it began.
HANDSHAKE_TIMEOUT = 5.0
FRAME_TIMEOUT = 30.0
_NONCE = 16


class Refused(ConnectionError):
    """The peer broke the protocol (no or a wrong proof, a malformed or oversized frame); the reason."""


def new_secret() -> str:
    """A fresh secret for one run (hex, 256 bits)."""
    return secrets.token_hex(32)


def secret_from_env() -> str | None:
    """The run's store secret from :data:`SECRET_VARIABLE` (None: not set)."""
    value = os.environ.get(SECRET_VARIABLE, "")
    return value or None


def _proof(secret: str, role: bytes, first: bytes, second: bytes) -> str:
    return hmac.new(secret.encode(), role + first + second, hashlib.sha256).hexdigest()


def _nonce(header: dict[str, Any]) -> bytes:
    value = header.get("nonce")
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != _NONCE:
        raise Refused(f"a handshake nonce of {_NONCE} bytes (hex) expected, found {str(value)[:40]!r}")
    return raw


def server_handshake(sock: socket.socket, secret: str) -> None:
    """The store's side: prove the secret and have the client prove it; :class:`Refused` if it cannot.

    Both sides set ``TCP_NODELAY``: a message is a small header and then its payload, and with Nagle's
    algorithm the payload waited for the header's delayed ACK (40 ms on Linux) on every request."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mine = os.urandom(_NONCE)
    send(sock, {"nonce": mine.hex()})
    header, _ = recv(sock, max_payload=0)
    theirs = _nonce(header)
    if not hmac.compare_digest(str(header.get("proof", "")), _proof(secret, b"client", mine, theirs)):
        raise Refused("the client did not prove it knows the run's secret")
    send(sock, {"proof": _proof(secret, b"server", theirs, mine)})


def client_handshake(sock: socket.socket, secret: str) -> None:
    """The client's side: :class:`Refused` if the store cannot prove the secret."""
    header, _ = recv(sock, max_payload=0)
    theirs = _nonce(header)
    mine = os.urandom(_NONCE)
    send(sock, {"nonce": mine.hex(), "proof": _proof(secret, b"client", theirs, mine)})
    header, _ = recv(sock, max_payload=0)
    if not hmac.compare_digest(str(header.get("proof", "")), _proof(secret, b"server", mine, theirs)):
        raise Refused("the store did not prove it knows the run's secret")


def connect(address: str, secret: str, timeout: float = 30.0) -> socket.socket:
    """An authenticated connection to the store at ``host:port``."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=min(timeout, HANDSHAKE_TIMEOUT))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames go at once (see server_handshake)
    try:
        client_handshake(sock, secret)
        sock.settimeout(timeout)
    except BaseException:
        sock.close()
        raise
    return sock


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    if payload:
        header = {**header, "nbytes": len(payload)}
    raw = json.dumps(header).encode()
    sock.sendall(struct.pack(">I", len(raw)) + raw)
    if payload:
        sock.sendall(payload)


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket: on a blocking socket in one call that returns once all of it is there
    (``MSG_WAITALL``), not in one call per segment that arrives."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            raise ConnectionError("store connection closed")
        got += k


def set_kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking with kernel timeouts of ``seconds`` for each send and receive: a call then
    blocks in the kernel until it is done (Python's own timeouts poll the socket before each call and
    read a large message in pieces), and a stalled peer still ends it (``OSError``, EAGAIN)."""
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_exact_into(sock, memoryview(buf))
    return bytes(buf)


def recv_header(sock: socket.socket) -> dict[str, Any]:
    """One message's header, checked: a JSON object of at most :data:`MAX_HEADER` bytes whose
    ``nbytes``, if any, is an integer >= 0 (the payload is the caller's to read)."""
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_HEADER:
        raise Refused(f"a header of {n} bytes (at most {MAX_HEADER})")
    try:
        header = json.loads(_recv_exact(sock, n))
    except ValueError:
        raise Refused("a header that is not JSON") from None
    if not isinstance(header, dict):
        raise Refused(f"a header that is not a JSON object ({type(header).__name__})")
    nbytes = header.get("nbytes", 0)
    if type(nbytes) is not int or nbytes < 0:
        raise Refused(f"nbytes must be an integer >= 0, found {nbytes!r}")
    return header


def recv(sock: socket.socket, max_payload: int | None = None) -> tuple[dict[str, Any], bytes]:
    """One message; a payload larger than ``max_payload`` (None: no bound) is refused unread."""
    header = recv_header(sock)
    nbytes = header.get("nbytes", 0)
    if max_payload is not None and nbytes > max_payload:
        raise Refused(f"a payload of {nbytes} bytes (at most {max_payload} here)")
    return header, _recv_exact(sock, nbytes) if nbytes else b""


def request(address: str, header: dict[str, Any], payload: bytes = b"", timeout: float = 30.0,
            secret: str | None = None) -> tuple[dict[str, Any], bytes]:
    """One request and its reply, on an authenticated connection (``secret``: the run's; None: from
    :data:`SECRET_VARIABLE`)."""
    key = secret if secret is not None else secret_from_env()
    if key is None:
        raise Refused(f"{SECRET_VARIABLE} is not set: the stores answer only peers that know the run's secret")
    with connect(address, key, timeout) as s:
        send(s, header, payload)
        return recv(s)
