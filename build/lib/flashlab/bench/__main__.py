"""``python -m flashlab.bench``: runs :func:`flashlab.bench.cli.main` (its ``--help`` lists the
options)."""
from __future__ import annotations

import sys

from flashlab.bench.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
