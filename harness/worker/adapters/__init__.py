"""Framework adapters of the boot module: what PyTorch Lightning, the Hugging Face Trainer and accelerate
know that torch's hooks do not — the framework's own step count (where a restored job says it resumed, and
a check on the count the hooks keep), its model object, when its save begins and what it restored from.

Each is imported only when its framework is, and acts only under the harness (a
:class:`~harness.worker.hooks.ScriptProbe` is installed). ``workload.adapters`` names the ones wanted
(null: each one whose framework is installed); naming one whose framework is not installed is refused.
"""
from __future__ import annotations

import importlib.util

#: Adapter name -> the module of its framework.
FRAMEWORKS = {"lightning": "lightning", "transformers": "transformers", "accelerate": "accelerate"}


def installed(name: str) -> bool:
    """Whether adapter ``name``'s framework can be imported here."""
    return importlib.util.find_spec(FRAMEWORKS[name]) is not None
