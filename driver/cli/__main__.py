"""``python -m driver.cli``: the ``tranche`` command without an installed entry point."""

import sys

from driver.cli import main

sys.exit(main())
