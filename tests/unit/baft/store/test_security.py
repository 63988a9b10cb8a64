"""The node store lets no one in without the run's secret, and no request can make it misbehave.

Raw sockets against a real store: no handshake, a wrong secret, garbage, an oversized header or
payload, a truncated frame, a client that goes quiet, a rank outside the job. Each is refused and
journaled (``store_refused``), and the store keeps serving the workers that know the secret.
"""
from __future__ import annotations

import json
import socket
import struct
import threading
from pathlib import Path

import pytest

import baft.store.cli
import baft.store.handler
import baft.store.server
from baft.errors import BaftConfigError
from baft.store.client import StoreClient
from baft.store.wire import (
    MAX_HEADER,
    Refused,
    client_handshake,
    connect,
    recv,
    request,
    send,
)

from harness.run.nodeenv import free_port
from tests.fakes.stores import SECRET, seal, wait_for


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BAFT_STORE_SECRET", SECRET)
    monkeypatch.setattr(baft.store.handler, "HANDSHAKE_TIMEOUT", 0.5)  # a quiet peer is dropped quickly in tests
    monkeypatch.setattr(baft.store.handler, "FRAME_TIMEOUT", 0.5)
    address = f"127.0.0.1:{free_port()}"
    st = baft.store.server.Store(baft.store.config.StoreConfig(root=tmp_path / "node0", node=0, addresses=[address],
                                                 journal=tmp_path / "j.jsonl", secret=SECRET, world_size=4,
                                                 max_payload=1 << 20))
    server = baft.store.handler.Server(("127.0.0.1", int(address.rsplit(":", 1)[1])), baft.store.handler.Handler)
    server.store = st
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield address, tmp_path / "j.jsonl"
    st.close()
    server.shutdown()
    server.server_close()


def refusals(journal: Path) -> list[str]:
    return [e["reason"] for e in map(json.loads, journal.read_text().splitlines()) if e["event"] == "store_refused"]


def still_serving(address: str) -> None:
    reply, _ = request(address, {"op": "ping"}, secret=SECRET)
    assert reply == {"ok": True, "node": 0}


def raw(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def closed(s: socket.socket) -> bool:
    """Whether the store ends the connection within the socket's timeout (EOF or a reset)."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    return True


def test_garbage_instead_of_a_handshake_is_refused(store) -> None:
    address, journal = store
    s = raw(address)
    recv(s)  # the store's hello: a nonce
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed(s)
    wait_for(lambda: any(f"a header of {int.from_bytes(b'GET ', 'big')} bytes" in r for r in refusals(journal)))
    still_serving(address)


@pytest.mark.parametrize("secret", ["wrong-" + "x" * 30, ""])
def test_a_peer_without_the_runs_secret_gets_nothing(store, secret: str) -> None:
    address, journal = store
    with pytest.raises(ConnectionError):  # the store closes on it before any request is read
        s = connect(address, secret)
        send(s, {"op": "locate", "rank": 0})
        recv(s)
    wait_for(lambda: "the client did not prove it knows the run's secret" in refusals(journal))
    assert StoreClient(address, secret="wrong-" + "y" * 30).sealed(0, 1, Path("x")) is False  # never connected
    assert StoreClient(address, secret="wrong-" + "y" * 30).locate(0) == []  # nothing answered
    still_serving(address)


def test_a_client_never_trusts_a_store_without_the_secret() -> None:
    """A stand-in that is not the run's store (it cannot compute the proof): the client refuses it,
    so a restore never takes bytes from it."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            send(conn, {"nonce": "00" * 16})
            recv(conn)
            send(conn, {"proof": "0" * 64})
    threading.Thread(target=impostor, daemon=True).start()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    with pytest.raises(Refused, match="the store did not prove it knows the run's secret"):
        client_handshake(s, SECRET)
    s.close()
    listener.close()


def test_an_oversized_header_or_payload_is_refused_unread(store) -> None:
    address, journal = store
    s = raw(address)
    client = connect(address, SECRET)
    # a length prefix far beyond any header
    client.sendall(struct.pack(">I", MAX_HEADER + 1))
    assert closed(client)
    # a put announcing 10 GB: refused before a byte of it is read (max_payload 1 MiB here)
    client = connect(address, SECRET)
    send(client, {"op": "put", "rank": 0, "version": 1, "nbytes": 10 << 30})
    # no byte of the payload is ever sent: a reply at all says it was refused before any was read
    reply, _ = recv(client)
    assert reply["ok"] is False and "a replica of 10737418240 bytes (at most 1048576 here)" in reply["error"]
    assert closed(client)
    assert not list((Path(journal).parent / "node0").glob("replica-*"))  # nothing was written
    wait_for(lambda: len([r for r in refusals(journal) if "bytes" in r]) >= 2)
    s.close()
    still_serving(address)


def test_a_truncated_or_stalled_message_is_dropped_and_the_store_keeps_serving(store) -> None:
    address, journal = store
    quiet = raw(address)  # connects and never says anything
    half = connect(address, SECRET)
    half.sendall(struct.pack(">I", 200) + b'{"op": "pi')  # and stops in the middle of its header
    still_serving(address)  # meanwhile others are served
    assert closed(quiet) and closed(half)
    wait_for(lambda: sum("went quiet" in r for r in refusals(journal)) >= 2)
    cut = connect(address, SECRET)
    cut.sendall(struct.pack(">I", 200) + b'{"op"')
    cut.close()  # a truncated frame: the connection ends, nothing else happens
    still_serving(address)


@pytest.mark.parametrize(("header", "says"), [
    ({"op": "locate", "rank": 4}, "rank 4 is not a rank of this job (world size 4)"),
    ({"op": "fetch", "rank": 99, "version": 0}, "rank 99 is not a rank of this job"),
    ({"op": "sealed", "rank": 0, "version": 1, "file": "../../etc/passwd"}, "is not rank 0's slot for version 1"),
    ({"op": "pull", "rank": 1, "version": 2, "dest": "/tmp/elsewhere/rank-00001.slot2"}, "is not rank 1's slot"),
    ({"op": "frobnicate"}, "unknown op 'frobnicate'"),
    ({"op": "ping", "nbytes": 5}, "a payload with op 'ping'"),
])
def test_a_request_out_of_bounds_is_refused_and_journaled(store, header: dict, says: str) -> None:
    address, journal = store
    s = connect(address, SECRET)
    send(s, header)
    if header["op"] != "sealed" and not header.get("nbytes"):
        reply, _ = recv(s)
        assert reply["ok"] is False and says in reply["error"], reply
    wait_for(lambda: any(says in r for r in refusals(journal)))
    s.close()
    still_serving(address)


def test_a_put_from_a_peer_lands_in_the_replica_ring_streamed_to_its_file(store, tmp_path: Path) -> None:
    address, _ = store
    data = seal(tmp_path / "src", rank=2, version=3, fill=7).read_bytes()
    reply, _ = request(address, {"op": "put", "rank": 2, "version": 3}, data, secret=SECRET)
    assert reply["ok"], reply
    [replica] = (tmp_path / "node0").glob("replica-rank-00002.slot*")
    assert replica.read_bytes()[: len(data)] == data and replica.stat().st_size == len(data)


def test_without_the_secret_nothing_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("BAFT_STORE_SECRET", raising=False)
    with pytest.raises(BaftConfigError, match="BAFT_STORE_SECRET"):
        StoreClient("127.0.0.1:1")
    with pytest.raises(SystemExit) as info:
        baft.store.cli.parse_args(["--root", str(tmp_path), "--node", "0", "--addresses", "127.0.0.1:1"])
    assert info.value.code == 2 and "secret: expected the run's store secret" in capsys.readouterr().err
    with pytest.raises(Refused, match="BAFT_STORE_SECRET is not set"):
        request("127.0.0.1:1", {"op": "ping"})
