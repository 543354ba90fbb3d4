"""``hack/cache_dir.py`` finds the cache where the build scripts put it (``hack/build-*.sh``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.cache_dir import cache_root


def test_the_cache_root_follows_the_build_scripts_rule(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TRANCHE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "tranche"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "tranche"
    monkeypatch.setenv("TRANCHE_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    # The scripts read ${VAR:-default}: an empty variable counts as unset.
    monkeypatch.setenv("TRANCHE_CACHE_DIR", "")
    assert cache_root() == tmp_path / "xdg" / "tranche"
    script = (Path(__file__).resolve().parents[3] / "hack" / "build-image.sh").read_text()
    assert "cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}" in script
