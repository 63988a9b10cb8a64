"""A stand-in for the few W&B GraphQL queries :mod:`harness.cluster.wandbprogress` makes, for the real ``wandb`` client.

No W&B server is reachable here, so tests point ``wandb.Api(overrides={"base_url": standin.url})``
at this one. It answers ``POST /graphql``:

* any query selecting ``viewer`` (the client checks its credentials, then asks the default entity):
  one user ``tester`` of entity ``ent``;
* a query of ``project(name, entityName) { run(name) {...} }`` (``Api.run``, ``Run.load``,
  ``Run.lastHistoryStep``): the run's fields as W&B returns them (``state``, ``createdAt``,
  ``historyKeys: {lastStep, keys}``, ``summaryMetrics`` as a JSON string, ...), or
  ``{"project": {"run": null}}`` for a run that does not exist;

and 200 with nothing to anything else (the client's own telemetry). ``runs`` maps
``"entity/project/run_id"`` to ``{"state", "created_at", "last_step"}``; change it between
requests (``log(path, step)``, ``finish(path)``). ``queries`` counts the run queries answered. An
``answer`` that raises ``ConnectionAbortedError`` drops the request unanswered (a server that hangs up).
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VIEWER = {"id": "VXNlcjox", "entity": "ent", "username": "tester", "email": "tester@example.invalid",
          "flags": "{}", "teams": {"edges": []}}


class WandbStandIn:
    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.queries = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def create(self, path: str, created_at: str = "2026-11-30T12:00:00") -> None:
        with self.lock:
            self.runs[path] = {"state": "running", "created_at": created_at, "last_step": None}

    def log(self, path: str, step: int) -> None:
        """The job logged a history row at ``step`` (W&B keeps the highest)."""
        with self.lock:
            run = self.runs[path]
            run["last_step"] = step if run["last_step"] is None else max(run["last_step"], step)

    def finish(self, path: str, state: str = "finished") -> None:
        with self.lock:
            self.runs[path]["state"] = state

    def answer(self, query: dict[str, Any]) -> dict[str, Any]:
        text = query.get("query") or ""
        if "viewer" in text:
            return {"viewer": VIEWER}
        if "run(name:" in text:
            v = query.get("variables") or {}
            path = f"{v.get('entity')}/{v.get('project')}/{v.get('name')}"
            with self.lock:
                self.queries += 1
                run = dict(self.runs[path]) if path in self.runs else None
            if run is None:
                return {"project": {"run": None}}
            last = run["last_step"]
            return {"project": {"run": {
                "projectId": 1, "id": "UnVuOjE=", "tags": [], "name": v.get("name"), "displayName": v.get("name"),
                "sweepName": None, "state": run["state"], "config": "{}", "group": None, "jobType": None,
                "commit": None, "readOnly": False, "createdAt": run["created_at"], "heartbeatAt": run["created_at"],
                "description": None, "notes": None, "systemMetrics": "{}",
                "summaryMetrics": json.dumps({} if last is None else {"_step": last}),
                "historyLineCount": 0 if last is None else last + 1, "user": {"name": "tester", "username": "tester"},
                "historyKeys": {"keys": {}} if last is None else {"lastStep": last, "keys": {}}}}}
        return {}

    def __enter__(self) -> WandbStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(standin: WandbStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            out: dict[str, Any] = {}
            if self.path.rstrip("/").endswith("/graphql"):
                try:
                    out = {"data": standin.answer(json.loads(raw))}
                except ValueError:
                    out = {"errors": [{"message": "the body is not JSON"}]}
                except ConnectionAbortedError:  # a test's broken server: drop the request unanswered
                    self.close_connection = True
                    return
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
