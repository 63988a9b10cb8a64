"""What a training pod of ``baft deploy`` runs: torchrun, with this pod's role in the rendezvous said explicitly.

``python -m harness.cluster.pod [--workdir DIR] [--preload MODULE] TORCHRUN_ARGS...`` replaces itself with torchrun
(``python -m harness.run.agent [--preload MODULE] --rdzv-conf is_host=1|0 TORCHRUN_ARGS...``, see
that module): pod 0 (``BAFT_NODE_INDEX=0``) hosts the c10d rendezvous store, every other pod is a
client. Left to itself, torchrun decides by matching the
endpoint's host name against the machine, which in a pod needs pod 0's DNS record to resolve
already (right after a pod starts it may not: then nobody hosts, and every agent times out) and
which lets the first of several agents sharing one host win (so killing another "pod" there took
the store down). The local launcher makes the same choice explicitly. It also shortens the
keep-alive (:data:`~harness.run.agents.KEEP_ALIVE`): a killed pod's agent is replaced by a new one, and
the survivors admit it only once the dead one is declared gone (15 s with torchrun's defaults).
``--workdir``: an unmodified script's working directory (on the shared volume, for its relative
checkpoint paths), made if missing and entered before torchrun starts; its workers inherit it.
"""
from __future__ import annotations

import os
import sys

from harness.run.agent import split_preload
from harness.run.agents import KEEP_ALIVE


def torchrun_command(argv: list[str], node_index: int) -> list[str]:
    """The torchrun command line (:mod:`harness.run.agent`, leading ``--preload`` pairs kept first)
    for the pod with this index."""
    if any(a == "--rdzv-conf" or a.startswith("--rdzv-conf=") for a in argv):
        raise SystemExit("harness.cluster.pod: give no --rdzv-conf; it sets is_host from BAFT_NODE_INDEX itself")
    conf = f"is_host={int(node_index == 0)}{KEEP_ALIVE}"
    preload, rest = split_preload(argv)
    return [sys.executable, "-m", "harness.run.agent", *(a for m in preload for a in ("--preload", m)),
            "--rdzv-conf", conf, *rest]


def split_workdir(argv: list[str]) -> tuple[str | None, list[str]]:
    """A leading ``--workdir DIR`` and the rest of the arguments."""
    if argv[:1] == ["--workdir"]:
        if len(argv) < 2 or not argv[1].startswith("/"):
            raise SystemExit("harness.cluster.pod: --workdir needs an absolute directory")
        return argv[1], argv[2:]
    return None, argv


def main(argv: list[str] | None = None) -> int:
    index = os.environ.get("BAFT_NODE_INDEX", "")
    if not index.isdigit():
        print(f"harness.cluster.pod: BAFT_NODE_INDEX must be the pod's index (a number), found {index!r}", file=sys.stderr)
        return 2
    workdir, rest = split_workdir(sys.argv[1:] if argv is None else argv)
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
    cmd = torchrun_command(rest, int(index))
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
