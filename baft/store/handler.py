"""The node store's TCP side: one thread per connection, each proving the run's secret before any message.

A connection starts with the mutual proof (:mod:`baft.store.wire`) within ``HANDSHAKE_TIMEOUT``; then each
message is delivered whole within ``FRAME_TIMEOUT`` once it began, while an authenticated worker or peer may
stay quiet between messages (a kept connection). A ``put`` streams its replica into the store's ring
(:meth:`~baft.store.server.Store.receive_put`); any other request is answered by
:meth:`~baft.store.server.Store.handle`, a ``sealed`` notification not at all. What breaks the protocol is
refused and journaled (``store_refused``), and the connection closed. Torch-free.
"""
from __future__ import annotations

import socket
import socketserver

from baft.store.server import Store
from baft.store.wire import (
    FRAME_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    Refused,
    recv_header,
    send,
    server_handshake,
    set_kernel_timeouts,
)

#: How often the server looks whether it was asked to stop (its only wake-up while nothing happens).
SHUTDOWN_POLL = 0.5


class Handler(socketserver.BaseRequestHandler):
    """One connection: the handshake within ``HANDSHAKE_TIMEOUT``, then messages, each delivered whole
    within ``FRAME_TIMEOUT`` once it began (an authenticated worker may stay quiet between them)."""

    def handle(self) -> None:
        store: Store = self.server.store  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        peer = "%s:%s" % self.client_address[:2]
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT)
            server_handshake(sock, store.config.secret)
            # From here the socket blocks in the kernel with a timeout per call (a large replica lands in
            # one receive, not one per segment); quiet between messages is allowed, mid-message it is not.
            set_kernel_timeouts(sock, FRAME_TIMEOUT)
            while True:
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        return  # the peer closed between messages
                except BlockingIOError:
                    continue  # quiet for FRAME_TIMEOUT between messages: a kept connection may be
                header = recv_header(sock)
                op = header.get("op")
                if op == "put":
                    try:
                        reply, data = store.receive_put(header, sock)
                    except (ValueError, Refused) as e:  # the payload may be unread: the stream is out of step
                        store.refused(str(e), op="put", peer=peer)
                        send(sock, {"ok": False, "error": str(e)})
                        return
                elif header.get("nbytes"):
                    raise Refused(f"a payload with op {str(op)[:40]!r} (only put carries one)")
                else:
                    reply, data = store.handle(header)
                if op != "sealed":  # notifications get no answer
                    send(sock, reply, data)
        except Refused as e:
            store.refused(str(e), peer=peer)
        except (socket.timeout, BlockingIOError):
            store.refused("the peer went quiet in the middle of a message or the handshake", peer=peer)
        except (ConnectionError, OSError):
            return


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
