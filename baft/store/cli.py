"""``python -m baft.store``: one node's store, its config from the command line (:class:`StoreConfig`'s fields)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import signal
import textwrap
import threading
import time
from pathlib import Path

from baft.errors import BaftConfigError
from baft.fields import field_docs
from baft.priority import apply as apply_priority
from baft.store.config import ReplicationConfig, StoreConfig
from baft.store.handler import SHUTDOWN_POLL, Handler, Server
from baft.store.server import Store
from baft.store.wire import secret_from_env


def _replication_help() -> str:
    """The keys of ``--replication`` with their defaults and what they mean."""
    docs = field_docs(ReplicationConfig)
    lines = ["--replication JSON: a ReplicationConfig object; a key left out takes its default:"]
    for f in dataclasses.fields(ReplicationConfig):
        head = f"  {f.name} (default {json.dumps(f.default)}): "
        lines.append(textwrap.fill(docs.get(f.name, ""), 100, initial_indent=head, subsequent_indent=" " * 4))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> StoreConfig:
    """The store's config from its command line (flags named after the :class:`StoreConfig` fields)."""
    docs = field_docs(StoreConfig)
    p = argparse.ArgumentParser(prog="python -m baft.store", description="per-node BAFT checkpoint store",
                                epilog=_replication_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, required=True, help=docs.get("root"))
    p.add_argument("--node", type=int, required=True, help=docs.get("node"))
    p.add_argument("--addresses", required=True, help=docs.get("addresses", "") + " Comma-separated.")
    p.add_argument("--journal", type=Path, help=docs.get("journal"))
    p.add_argument("--listen", help=docs.get("listen"))
    p.add_argument("--replication", metavar="JSON", help=docs.get("replication"))
    p.add_argument("--world-size", type=int, default=0, help=docs.get("world_size"))
    p.add_argument("--max-payload", type=int, default=0, help=docs.get("max_payload"))
    a = p.parse_args(argv)
    try:
        replication = ReplicationConfig.from_json(a.replication) if a.replication else ReplicationConfig()
        return StoreConfig(root=a.root, node=a.node, addresses=a.addresses.split(","), journal=a.journal,
                           listen=a.listen, replication=replication, secret=secret_from_env() or "",
                           world_size=a.world_size, max_payload=a.max_payload)
    except BaftConfigError as e:
        p.error(str(e))
        raise  # p.error exits


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    applied = apply_priority(config.replication.priority)  # before any thread starts: they inherit it
    store = Store(config)
    addresses = config.addresses
    host, port = addresses[config.node].rsplit(":", 1)
    server = Server((config.listen or host, int(port)), Handler)
    server.store = store  # type: ignore[attr-defined]
    (config.root / "store.pid").write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    # cpu_seconds: what starting cost (the interpreter, the imports), so a reader can tell it from serving
    store.log("store_start", pid=os.getpid(), address=addresses[config.node], cpu_seconds=round(time.process_time(), 3),
              **applied.fields())
    try:
        server.serve_forever(poll_interval=SHUTDOWN_POLL)
    finally:
        store.close()
        server.server_close()
        usage = resource.getrusage(resource.RUSAGE_SELF)  # what replicating and serving cost this node's cores
        store.log("store_stop", cpu_seconds=round(usage.ru_utime + usage.ru_stime, 3),
                  max_rss_mbytes=round(usage.ru_maxrss / 1024, 1))
    return 0

