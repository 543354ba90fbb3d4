"""``python -m driver.cli``: the ``tranche`` command without an installed entry point."""

import sys

from driver.cli import process_main

sys.exit(process_main())
