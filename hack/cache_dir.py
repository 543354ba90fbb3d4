"""Where built things are cached, outside the repository: the rule of the build scripts
(``hack/build-*.sh``): ``$TRANCHE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tranche``, else
``~/.cache/tranche``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("TRANCHE_CACHE_DIR") or xdg / "tranche")
