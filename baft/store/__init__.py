"""The node store, torch-free: one process per node that holds its ranks' snapshot copies and replicates them.

``python -m baft.store`` starts one (:mod:`baft.store.server`, its command line from :class:`StoreConfig`).
The room: the server and its rounds (:mod:`~baft.store.server`, :mod:`~baft.store.peerrounds`), its
connections (:mod:`~baft.store.handler`), its scheduling group (:mod:`~baft.store.governor`), the
worker's client (:mod:`~baft.store.client`), the wire format and handshake (:mod:`~baft.store.wire`), the
connection to a peer (:mod:`~baft.store.peerlink`), the answers to a restore (:mod:`~baft.store.restores`),
where replicas go (:mod:`~baft.store.placement`), which versions (:mod:`~baft.store.stride`), how fast
(:mod:`~baft.store.linkmeter`), when training traffic is in flight (:mod:`~baft.store.traffic`), and the
store's rings of slot files (:mod:`~baft.store.ring`).
Its names resolve on first use: importing one module of the room imports no other.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from baft._lazy import exports

if TYPE_CHECKING:
    from baft.store.cli import main, parse_args
    from baft.store.config import ReplicationConfig, StoreConfig
    from baft.store.server import Store

__all__ = ["ReplicationConfig", "Store", "StoreConfig", "main", "parse_args"]
# the module this room replaced (baft/store.py) answered for the server's names
__getattr__, __dir__ = exports(__name__, {"ReplicationConfig": ".config", "StoreConfig": ".config", "main": ".cli",
                                          "parse_args": ".cli"},
                               sources=(".server", ".handler"))
