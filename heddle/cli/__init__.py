"""heddle.cli: the ``heddle`` command line (docs/cli.md).

Subcommands import what they need when they run, so ``heddle version`` and
``heddle bench`` start fast.
"""

from ._main import main

__all__ = ["main"]
