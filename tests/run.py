"""The test run of CI and tox: ``python -m tests.run [--types] [PYTEST PATHS OR OPTIONS]``.

Two pytest processes run side by side (and, with ``--types``, the type checker beside them):

* the tests marked ``serial`` (they measure times or rates, shape links, bound a stop in seconds), one at a
  time, at normal CPU priority;
* everything else on three pytest-xdist workers (``--dist loadgroup``) at the lowest priority (nice 19),
  what their torchrun jobs inherit;
* with ``--types``, ``mypy`` (pyproject's ``[tool.mypy]``) at nice 10: a minute of one core that the tests,
  which wait on their jobs more than they compute, leave idle.

On two cores the parallel part keeps both busy, so a measuring test alone after it would leave CPU idle
while it waits on a throttled link or a watchdog. Beside it at nice 19 the measuring tests still get a core
whenever they want one: the kernel gives a nice-0 task about 68 times the share of a nice-19 one. The
output of the serial part (and the checker's) is printed after the parallel part's; the exit status is the first
non-zero of them.
SIGINT or SIGTERM is passed to both, and the run waits for them to stop (each pytest stops its jobs).
Afterwards nothing the run made may be left in ``/dev/shm`` (multiprocessing's semaphores, a run's memory
directory): what is, is listed and fails the run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

NO_TESTS = 5  # pytest's exit status when it collected nothing
#: Each part names its slowest tests at the end: where CI's minutes go (the goal is 15 in all).
DURATIONS = ["--durations=15", "--durations-min=5"]
SERIAL = ["-m", "serial", *DURATIONS]
PARALLEL = ["-n", "3", "--dist", "loadgroup", "-m", "not serial", *DURATIONS]
TYPES = ["-m", "mypy"]


def _lowest_priority() -> None:
    os.nice(19)


SHM = "/dev/shm"


def _shm_entries() -> set[str]:
    """What in /dev/shm a test run can leave: multiprocessing's semaphores and baft's memory directories."""
    try:
        return {n for n in os.listdir(SHM) if n.startswith(("sem.mp-", "baft-"))}
    except OSError:
        return set()


def _lower_priority() -> None:
    os.nice(10)


def main(args: list[str]) -> int:
    types = "--types" in args
    args = [a for a in args if a != "--types"] or ["tests"]
    before = _shm_entries()
    pytest = [sys.executable, "-m", "pytest"]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as serial_out, tempfile.TemporaryFile("w+") as types_out:
        checker = (subprocess.Popen([sys.executable, *TYPES], stdout=types_out, stderr=subprocess.STDOUT,
                                    preexec_fn=_lower_priority, start_new_session=True) if types else None)
        serial = subprocess.Popen([*pytest, *SERIAL, *args], stdout=serial_out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        parallel = subprocess.Popen([*pytest, *PARALLEL, *args], preexec_fn=_lowest_priority, start_new_session=True)
        children = tuple(p for p in (checker, serial, parallel) if p is not None)

        def forward(signum: int, _frame: object) -> None:
            for p in children:
                if p.poll() is None:
                    p.send_signal(signum)

        signal.signal(signal.SIGINT, forward)
        signal.signal(signal.SIGTERM, forward)
        serial_rc = serial.wait()
        serial_seconds = time.monotonic() - t0
        parallel_rc = parallel.wait()
        types_rc = checker.wait() if checker is not None else 0
        serial_out.seek(0)
        print(f"\n===== the serial tests (beside the parallel part; done after {serial_seconds:.0f} s) =====",
              flush=True)
        sys.stdout.write(serial_out.read())
        if checker is not None:
            types_out.seek(0)
            print("\n===== the types (mypy, beside the tests) =====", flush=True)
            sys.stdout.write(types_out.read())
    print(f"tests.run: serial exit {serial_rc} ({serial_seconds:.0f} s), parallel exit {parallel_rc} "
          f"({time.monotonic() - t0:.0f} s)" + (f", types exit {types_rc}" if checker is not None else ""), flush=True)
    codes = [rc for rc in (serial_rc, parallel_rc) if rc != NO_TESTS]  # paths with tests of one kind only
    if checker is not None:
        codes.append(types_rc)
    left = sorted(_shm_entries() - before)
    if left:
        print(f"tests.run: the run left {len(left)} entries in {SHM}: {', '.join(left[:12])}", flush=True)
        codes.append(1)
    return next((rc for rc in codes if rc), 0) if codes else NO_TESTS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
