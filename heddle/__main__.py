"""``python -m heddle`` is the ``heddle`` command."""

import sys

from heddle.operator._cli import main

sys.exit(main())
