"""The layouts ``baft fuzz --layout NAME`` runs a base scenario's workload on (torch-free, so the CLI
can offer the names without importing the campaign)."""
from __future__ import annotations

from typing import Any

#: The workload keys each layout sets on the base scenario. Each spreads its ranks (four; eight for the
#: 3-D ``pp-fsdp-tp``) over two nodes, so a schedule can lose a node and a version can be replicated to the
#: peer (the ``replicate`` phase).
LAYOUTS: dict[str, dict[str, Any]] = {
    "pp-fsdp": {"stages": 2, "data_parallel": 1, "dp_shard": 2, "tp": 1, "layout": "replica-major", "nodes": 2},
    "pp-tp": {"stages": 2, "data_parallel": 1, "dp_shard": 1, "tp": 2, "layout": "replica-major", "model": "gpt-tiny",
              "nodes": 2},
    "pp-fsdp-tp": {"stages": 2, "data_parallel": 1, "dp_shard": 2, "tp": 2, "layout": "stage-major",
                   "model": "gpt-tiny", "nodes": 2},
    "stage-major-dp": {"stages": 2, "data_parallel": 2, "dp_shard": 1, "tp": 1, "layout": "stage-major", "nodes": 2},
}
