"""A running plugin's ``/metrics``, as the tests read it."""

from __future__ import annotations

import urllib.request


def metrics_text(port: int) -> str:
    """The exposition text the plugin on 127.0.0.1:``port`` serves now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def scrape(port: int) -> dict[str, float]:
    """Every sample the plugin serves now: ``name{labels}`` (as written) to its value."""
    return {
        name: float(value)
        for line in metrics_text(port).splitlines()
        if line and not line.startswith("#")
        for name, value in [line.rsplit(" ", 1)]
    }
