"""``hack/cache-lib.sh``'s build steps, run by bash as the build scripts run them: a step's
output goes to the build log, and a failed step names itself and shows the log's end."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

LIB = Path(__file__).resolve().parents[3] / "hack" / "cache-lib.sh"


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` after sourcing the library, under the build scripts' shell options."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f'. "{LIB}"\n{script}'],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _build(tmp_path: Path, steps: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "cache" / "thing-1" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    return _bash(f'begin_build build-thing "{bin_dir}"\n{steps}\necho finished\n')


def test_a_step_logs_its_output_and_says_when_it_is_done(tmp_path: Path) -> None:
    out = _build(tmp_path, f'step "say hello" "{tmp_path}" -- sh -c "echo hello from \\$(pwd)"')
    assert out.returncode == 0, out.stderr
    assert out.stdout == "finished\n"
    assert "build-thing: [say hello] started" in out.stderr
    assert "build-thing: [say hello] done in" in out.stderr
    log = (tmp_path / "cache" / "thing-1" / "build.log").read_text()
    assert log == f"hello from {tmp_path}\n"


def test_a_failed_step_names_itself_shows_the_log_and_stops_the_build(tmp_path: Path) -> None:
    steps = (
        f'step "first" "{tmp_path}" -- true\n'
        f'step "compile" "{tmp_path}" -- sh -c "echo undefined: foo; exit 2"\n'
        f'step "never" "{tmp_path}" -- true'
    )
    out = _build(tmp_path, steps)
    assert out.returncode == 1
    assert "finished" not in out.stdout
    assert "build-thing: step 'compile' failed: (cd " in out.stderr
    assert "undefined: foo" in out.stderr  # the log's last lines
    assert "[never]" not in out.stderr


def _entry(root: Path, name: str, used: float | None) -> Path:
    entry = root / name
    entry.mkdir(parents=True)
    (entry / "tranche-image.tar").write_text("x")
    if used is not None:
        stamp = entry / ".stamp"
        stamp.write_text("image=...")
        os.utime(stamp, (used, used))
    return entry


def _prune(root: Path, keep: int) -> subprocess.CompletedProcess[str]:
    return _bash(f'prune_cache "{root}" image- {keep}\necho pruned\n')


def test_pruning_keeps_the_most_recently_used_images_and_nothing_else_of_theirs(
    tmp_path: Path,
) -> None:
    now = time.time()
    images = [_entry(tmp_path, f"image-0.1.0-{i}", now - 100 * i) for i in range(5)]
    unfinished = _entry(tmp_path, "image-0.1.0-partial", None)
    control_plane = _entry(tmp_path, "k8s-v1.37.2-etcd-v3.7.3-abc", now - 10_000)
    out = _prune(tmp_path, 3)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "pruned\n"
    assert [i.exists() for i in images] == [True, True, True, False, False]
    assert not unfinished.exists()
    assert control_plane.exists()  # another prefix, another owner


def test_pruning_an_empty_cache_is_not_an_error(tmp_path: Path) -> None:
    out = _prune(tmp_path, 3)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "pruned\n"


def test_pruning_a_go_tools_builds_keeps_the_newest_by_their_bin_stamps(tmp_path: Path) -> None:
    now = time.time()
    builds = []
    for i in range(4):
        stamp = tmp_path / f"kubeletclient-{i}" / "bin" / ".stamp"
        stamp.parent.mkdir(parents=True)
        stamp.write_text("kubeletclient built=...")
        os.utime(stamp, (now - 100 * i, now - 100 * i))
        builds.append(stamp.parents[1])
    unfinished = tmp_path / "kubeletclient-partial" / "bin"
    unfinished.mkdir(parents=True)
    other = _entry(tmp_path, "dra-test-driver-1", now - 10_000)
    out = _bash(f'prune_cache "{tmp_path}" kubeletclient- 2 bin/.stamp\necho pruned\n')
    assert out.returncode == 0, out.stderr
    assert [b.exists() for b in builds] == [True, True, False, False]
    assert not unfinished.parent.exists()
    assert other.exists()


def test_a_rebuild_over_an_entry_removes_its_stamp_first(tmp_path: Path) -> None:
    """An entry that lost a binary is rebuilt in place; cut short, it must not keep the old
    stamp that makes every later run trust its half-written files."""
    stamp = tmp_path / "cache" / "thing-1" / "bin" / ".stamp"
    stamp.parent.mkdir(parents=True)
    stamp.write_text("built before\n")
    out = _bash(f'begin_build build-thing "{stamp.parent}"\nexit 1\n')
    assert out.returncode == 1
    assert not stamp.exists()
