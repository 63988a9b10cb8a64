"""``python -m baft.store``: one node's store (:func:`baft.store.cli.main`)."""
from __future__ import annotations

import sys

from baft.store.cli import main

sys.exit(main())
