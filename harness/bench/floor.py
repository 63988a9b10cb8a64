"""The floor of replicating a slot: the simplest program that moves the same bytes, both sides' CPU.

One process ``sendfile()``s a file of the replica's size from ``/dev/shm`` to a
loopback TCP socket, again and again; the other ``recv_into()``s each copy into
a mapped ``/dev/shm`` file made once. Nothing else: no framing, no
authentication, no bookkeeping. ``baft bench`` runs it in the same run as the
stores and prints their CPU per replicated GB as a multiple of this one
(``bench.json`` ``replication.floor_cpu_seconds_per_gb``, ``replication.times_floor``).

Run alone: ``python -m harness.bench.floor [NBYTES] [COUNT]`` prints the JSON.
"""
from __future__ import annotations

import json
import mmap
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _receive(port_file: Path, path: Path, nbytes: int, count: int) -> dict[str, float]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_file.write_text(str(server.getsockname()[1]))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, nbytes)
        m = mmap.mmap(fd, nbytes)
        m[:] = bytes(nbytes)  # touched once, as the store's rings are
        conn, _ = server.accept()
        with conn:
            view = memoryview(m)
            c0, t0 = _cpu(), time.perf_counter()
            for _ in range(count):
                got = 0
                while got < nbytes:
                    k = conn.recv_into(view[got:], nbytes - got, socket.MSG_WAITALL)
                    if k == 0:
                        raise ConnectionError("the sender stopped early")
                    got += k
            result = {"cpu_seconds": _cpu() - c0, "seconds": time.perf_counter() - t0}
            view.release()
        m.close()
        os.close(fd)
    return result


def _send(port: int, path: Path, nbytes: int, count: int) -> dict[str, float]:
    fd = os.open(path, os.O_RDONLY)
    with socket.create_connection(("127.0.0.1", port)) as s:
        c0, t0 = _cpu(), time.perf_counter()
        for _ in range(count):
            sent = 0
            while sent < nbytes:
                sent += os.sendfile(s.fileno(), fd, sent, nbytes - sent)
        result = {"cpu_seconds": _cpu() - c0, "seconds": time.perf_counter() - t0}
    os.close(fd)
    return result


def measure(nbytes: int, count: int = 800) -> dict[str, Any]:
    """Both sides' CPU seconds per GB (and the wall rate) of moving ``count`` copies of ``nbytes``."""
    with tempfile.TemporaryDirectory(prefix="baft-floor-", dir="/dev/shm") as d:
        src, port_file = Path(d) / "src", Path(d) / "port"
        with open(src, "wb") as f:
            f.write(os.urandom(nbytes))
        args = [str(nbytes), str(count), d]
        recv = subprocess.Popen([sys.executable, "-m", "harness.bench.floor", "_recv", *args], stdout=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while not port_file.is_file() or not port_file.read_text():
                if recv.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the floor's receiver did not start")
                time.sleep(0.01)
            send = subprocess.run([sys.executable, "-m", "harness.bench.floor", "_send", *args, port_file.read_text()],
                                  stdout=subprocess.PIPE, check=True, timeout=120)
            out, _ = recv.communicate(timeout=120)
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
    sender, receiver = json.loads(send.stdout), json.loads(out)
    gb = nbytes * count / 1e9
    return {"bytes": nbytes, "count": count,
            "sender_cpu_seconds_per_gb": sender["cpu_seconds"] / gb,
            "receiver_cpu_seconds_per_gb": receiver["cpu_seconds"] / gb,
            "cpu_seconds_per_gb": (sender["cpu_seconds"] + receiver["cpu_seconds"]) / gb,
            "gbytes_per_s": gb / max(sender["seconds"], receiver["seconds"])}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("_recv", "_send"):
        nbytes, count, d = int(argv[1]), int(argv[2]), Path(argv[3])
        result = (_receive(d / "port", d / "dest", nbytes, count) if argv[0] == "_recv"
                  else _send(int(argv[4]), d / "src", nbytes, count))
        print(json.dumps(result))
        return 0
    nbytes = int(argv[0]) if argv else 1_260_000
    count = int(argv[1]) if len(argv) > 1 else 800
    print(json.dumps(measure(nbytes, count), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
