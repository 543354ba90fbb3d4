"""``hack/cache-lib.sh``'s build steps, run by bash as the build scripts run them: a step's
output goes to the build log, and a failed step names itself and shows the log's end."""

from __future__ import annotations

import subprocess
from pathlib import Path

LIB = Path(__file__).resolve().parents[3] / "hack" / "cache-lib.sh"


def _build(tmp_path: Path, steps: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "cache" / "thing-1" / "bin"
    bin_dir.mkdir(parents=True)
    script = f'. "{LIB}"\nbegin_build build-thing "{bin_dir}"\n{steps}\necho finished\n'
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


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
