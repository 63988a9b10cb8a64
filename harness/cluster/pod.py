"""What a training pod of ``baft deploy`` runs: torchrun, with this pod's role in the rendezvous said explicitly.

``python -m harness.cluster.pod [--preload MODULE] TORCHRUN_ARGS...`` replaces itself with torchrun
(``python -m harness.run.agent [--preload MODULE] --rdzv-conf is_host=1|0 TORCHRUN_ARGS...``, see
that module): pod 0 (``BAFT_NODE_INDEX=0``) hosts the c10d rendezvous store, every other pod is a
client. Left to itself, torchrun decides by matching the
endpoint's host name against the machine, which in a pod needs pod 0's DNS record to resolve
already (right after a pod starts it may not: then nobody hosts, and every agent times out) and
which lets the first of several agents sharing one host win (so killing another "pod" there took
the store down). The local launcher makes the same choice explicitly. It also shortens the
keep-alive (:data:`~harness.run.launcher.KEEP_ALIVE`): a killed pod's agent is replaced by a new one, and
the survivors admit it only once the dead one is declared gone (15 s with torchrun's defaults).
"""
from __future__ import annotations

import os
import sys

from harness.run.agent import split_preload
from harness.run.launcher import KEEP_ALIVE


def torchrun_command(argv: list[str], node_index: int) -> list[str]:
    """The torchrun command line (:mod:`harness.run.agent`, leading ``--preload`` pairs kept first)
    for the pod with this index."""
    if any(a == "--rdzv-conf" or a.startswith("--rdzv-conf=") for a in argv):
        raise SystemExit("harness.cluster.pod: give no --rdzv-conf; it sets is_host from BAFT_NODE_INDEX itself")
    conf = f"is_host={int(node_index == 0)}{KEEP_ALIVE}"
    preload, rest = split_preload(argv)
    return [sys.executable, "-m", "harness.run.agent", *(a for m in preload for a in ("--preload", m)),
            "--rdzv-conf", conf, *rest]


def main(argv: list[str] | None = None) -> int:
    index = os.environ.get("BAFT_NODE_INDEX", "")
    if not index.isdigit():
        print(f"harness.cluster.pod: BAFT_NODE_INDEX must be the pod's index (a number), found {index!r}", file=sys.stderr)
        return 2
    cmd = torchrun_command(sys.argv[1:] if argv is None else argv, int(index))
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
