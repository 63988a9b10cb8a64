"""What ``baft run`` is told besides its scenario: where the run goes, the reference cache, the reports, the
target, W&B. Stdlib only: ``baft``'s parser builds the flags from it (:mod:`harness.cliconfig`); the cluster
path's own flags are :class:`harness.cluster.config.ClusterOptions`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(kw_only=True, slots=True)
class RunOptions:
    """How ``baft run`` runs a scenario and what it writes."""

    out: Path | None = None
    """Output directory (default runs/NAME-TIMESTAMP)."""
    cache: Path | None = None
    """Reference cache (default ``$BAFT_CACHE_DIR`` or ``~/.cache/baft-harness``)."""
    report: bool = True
    """Write report.html, report.md and the plots."""
    target: Literal["local", "k8s"] = "local"
    """``local``: torchrun here; ``k8s``: the faults as Chaos Mesh objects against a job on a cluster (the flags
    below)."""
    wandb: bool = False
    """Also publish the run to Weights & Biases (offline unless ``wandb_online``)."""
    wandb_online: bool = False
    """Publish online (needs ``WANDB_API_KEY``)."""
