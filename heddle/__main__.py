"""``python -m heddle`` is the ``heddle`` command."""

import sys

from heddle.cli import main

# Guarded: vLLM starts its engine processes with "spawn", which re-imports __main__.
if __name__ == "__main__":
    sys.exit(main())
