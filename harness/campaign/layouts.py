"""The layouts ``baft fuzz --layout NAME`` runs a base scenario's workload on (torch-free, so the CLI
can offer the names without importing the campaign)."""
from __future__ import annotations

from typing import Any

#: The workload keys each layout sets on the base scenario. Each spreads its ranks (four; eight for the
#: 3-D ``pp-fsdp-tp``; two for the zero-bubble schedules) over two nodes, so a schedule can lose a node and a version can be replicated to the
#: peer (the ``replicate`` phase).
LAYOUTS: dict[str, dict[str, Any]] = {
    "pp-fsdp": {"stages": 2, "data_parallel": 1, "dp_shard": 2, "tp": 1, "layout": "replica-major", "nodes": 2},
    "pp-tp": {"stages": 2, "data_parallel": 1, "dp_shard": 1, "tp": 2, "layout": "replica-major", "model": "gpt-tiny",
              "nodes": 2},
    "pp-fsdp-tp": {"stages": 2, "data_parallel": 1, "dp_shard": 2, "tp": 2, "layout": "stage-major",
                   "model": "gpt-tiny", "nodes": 2},
    "stage-major-dp": {"stages": 2, "data_parallel": 2, "dp_shard": 1, "tp": 1, "layout": "stage-major", "nodes": 2},
    # the zero-bubble schedules: two ranks, each holding two model chunks, one rank per node
    "pp-zbv": {"stages": 2, "virtual_stages": 2, "schedule": "zbv", "data_parallel": 1, "dp_shard": 1, "tp": 1,
               "layout": "replica-major", "model": "gpt-tiny", "microbatches": 4, "nodes": 2},
    "pp-dualpipev": {"stages": 2, "virtual_stages": 2, "schedule": "dualpipev", "data_parallel": 1, "dp_shard": 1,
                     "tp": 1, "layout": "replica-major", "model": "gpt-tiny", "microbatches": 8, "nodes": 2},
    "pp-interleaved-zb": {"stages": 2, "virtual_stages": 2, "schedule": "interleaved-zb", "data_parallel": 1,
                          "dp_shard": 1, "tp": 1, "layout": "replica-major", "model": "gpt-tiny", "microbatches": 4,
                          "nodes": 2},
}
