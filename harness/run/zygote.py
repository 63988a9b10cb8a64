"""A warm parent for torchrun agents: one process per harness process imports torch once and forks
every agent the harness starts.

Each torchrun agent (:mod:`harness.run.agent`) starts by importing torch, pipelining and DCP, about 5 s
of CPU here, and a scenario starts at least two (its reference and its faulted run), one per node. A
:class:`Zygote` is a child of the harness started once (``python -m harness.run.zygote``): it imports
:data:`harness.run.agent.PRELOAD` and the worker module, starts no thread, and forks on request. Each
child is an agent as the launcher would have started it: a session of its own, the launch's environment
(what ``/proc/PID/environ`` and ``/proc/PID/cmdline`` show too, see :func:`_show`), its working
directory, its log as stdout and stderr, torchrun's arguments; it runs :func:`harness.run.agent.main`
and exits with its code. The zygote reaps it and tells the harness its exit status, so
:class:`Forked` answers as :class:`subprocess.Popen` does (``pid``, ``poll``, ``wait``,
``returncode``).

The zygote ends when the harness closes the connection, also when the harness is killed (the
kernel closes it). An agent outlives it like any orphan: the launch's token finds it
(:mod:`harness.run.processes`). Runs in network namespaces start their agents with ``ip netns exec``
as before (:func:`available` is then not asked).
"""
from __future__ import annotations

import atexit
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

#: Room reserved in the zygote's argument and environment areas for what each agent shows there.
ROOM = 16384
_ROOM_VARIABLE = "BAFT_ZYGOTE_ROOM"
_MESSAGE = 1 << 20


class ZygoteError(RuntimeError):
    """The zygote could not start or fork an agent."""


# -- in the zygote --------------------------------------------------------------------------------------

def _stat_fields() -> list[str]:
    return open("/proc/self/stat").read().rsplit(")", 1)[1].split()  # from field 3 (state) on


def _overwrite(start: int, end: int, data: bytes) -> None:
    """Write ``data`` (cut to fit, NUL-padded) over this process's memory ``[start, end)``."""
    size = end - start
    if size <= 0:
        return
    block = data[: size - 1].ljust(size, b"\0")
    ctypes.memmove(start, block, size)


def _show(argv: list[str], env: dict[str, str]) -> None:
    """Make ``/proc/self/cmdline`` and ``/proc/self/environ`` say ``argv`` and ``env`` (the baft
    variables first, what :mod:`harness.run.processes` and the tests look for), as they would for an
    agent started with ``exec``. Both files show the memory where the kernel put the zygote's own
    arguments and environment at its exec; the C environment no longer points there once
    ``os.environ`` has been replaced (each variable unset, then set anew)."""
    fields = _stat_fields()
    arg_start, arg_end, env_start, env_end = (int(fields[i]) for i in (45, 46, 47, 48))  # fields 48-51
    _overwrite(arg_start, arg_end, b"\0".join(a.encode() for a in argv) + b"\0")
    ordered = sorted(env.items(), key=lambda kv: (not kv[0].startswith("BAFT_"), kv[0]))
    _overwrite(env_start, env_end, b"".join(f"{k}={v}".encode() + b"\0" for k, v in ordered))


def _child(request: dict[str, Any], log_fd: int, closing: list[int]) -> None:
    """In the forked child: become the agent the request describes; never returns."""
    code = 1
    try:
        for fd in closing:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(devnull)
        os.close(log_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = [sys.executable, "-m", "harness.run.agent", *request["argv"]]
        _show(argv, request["env"])
        sys.argv = argv[2:]
        from harness.run.agent import main

        code = main(request["argv"])
    except SystemExit as e:  # as the interpreter would: an int is the status, anything else is said
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - said in the agent's log, then the agent fails
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode())


def serve(sock: socket.socket, preload: list[str]) -> None:
    """The zygote's loop: fork an agent per request, report each exit; return at the connection's end."""
    import importlib

    for name in preload:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    _send(sock, {"ready": os.getpid()})
    children: set[int] = set()
    while True:
        watched: list[Any] = [sock, wake_r]
        ready, _, _ = select.select(watched, [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _send(sock, {"exit": pid, "returncode": os.waitstatus_to_exitcode(status)})
        if sock in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                return  # the harness is gone (or done): its agents live on as orphans, found by their token
            request = json.loads(data)
            log_fd = fds[0]
            pid = os.fork()
            if pid == 0:
                _child(request, log_fd, [sock.fileno(), wake_r, wake_w])
            os.close(log_fd)
            children.add(pid)
            _send(sock, {"pid": pid})


def _main() -> None:
    fd = int(os.environ.pop("BAFT_ZYGOTE_FD"))
    os.environ.pop(_ROOM_VARIABLE, None)
    preload = [m for m in os.environ.pop("BAFT_ZYGOTE_PRELOAD", "").split(",") if m]
    sock = socket.socket(fileno=fd)
    try:
        serve(sock, preload)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


# -- in the harness -------------------------------------------------------------------------------------

class Forked:
    """An agent forked by the zygote, answering as :class:`subprocess.Popen` does."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_status(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._zygote.exit_status(self.pid, timeout=timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The harness's end: starts the zygote process, asks it for agents, learns how they ended."""

    def __init__(self, preload: list[str]) -> None:
        self.preload = list(preload)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "BAFT_ZYGOTE_FD": str(theirs.fileno()), "OMP_NUM_THREADS": "1",
               "BAFT_ZYGOTE_PRELOAD": ",".join(self.preload), _ROOM_VARIABLE: "x" * ROOM}
        self.process = subprocess.Popen([sys.executable, "-m", "harness.run.zygote", " " * ROOM], env=env,
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._sock = mine
        self._lock = threading.Lock()  # one request at a time
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="baft-zygote", daemon=True)
        self._reader.start()
        if "ready" not in self._reply(timeout=120):
            self.close()
            raise ZygoteError("the agent zygote did not start")

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MESSAGE)
            except OSError:
                data = b""
            with self._changed:
                if not data:
                    self._closed = True
                    self._changed.notify_all()
                    return
                message = json.loads(data)
                if "exit" in message:
                    self._exits[message["exit"]] = message["returncode"]
                else:
                    self._replies.append(message)
                self._changed.notify_all()

    def _reply(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._replies:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise ZygoteError("the agent zygote is gone" if self._closed else "the agent zygote did not answer")
                self._changed.wait(left)
            return self._replies.pop(0)

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log: Any) -> Forked:
        """Fork an agent running ``python -m harness.run.agent ARGV`` with ``env``, in ``cwd``, writing
        to the open file ``log``."""
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        if len(request) >= _MESSAGE:
            raise ZygoteError("the agent's arguments and environment are too large to send")
        with self._lock:
            try:
                socket.send_fds(self._sock, [request], [log.fileno()])
            except OSError as e:
                raise ZygoteError(f"the agent zygote is gone ({e})") from None
            reply = self._reply(timeout=60)
        return Forked(self, reply["pid"], [sys.executable, "-m", "harness.run.agent", *argv])

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        """The exit status of agent ``pid`` once it ended (within ``timeout`` seconds; None: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while pid not in self._exits:
                if self._closed:  # nobody reaps it now: it ends as an orphan; wait until it is gone
                    return self._orphan_status(pid, deadline)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._changed.wait(left if left is None else min(left, 1.0))
            return self._exits[pid]

    @staticmethod
    def _orphan_status(pid: int, deadline: float | None) -> int | None:
        while os.path.exists(f"/proc/{pid}"):
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return -signal.SIGKILL  # its status went to init: say it did not end well

    def alive(self) -> bool:
        return not self._closed and self.process.poll() is None

    def close(self) -> None:
        """End the zygote (its agents, if any still run, are not touched)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_shared: dict[tuple[str, ...], Zygote] = {}
_shared_lock = threading.Lock()


def shared(preload: list[str]) -> Zygote:
    """This process's zygote for ``preload`` (started at the first call, ended when this process exits)."""
    key = tuple(preload)
    with _shared_lock:
        z = _shared.get(key)
        if z is None or not z.alive():
            z = _shared[key] = Zygote(preload)
            atexit.register(z.close)
        return z


if __name__ == "__main__":
    _main()
