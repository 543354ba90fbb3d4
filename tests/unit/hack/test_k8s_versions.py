"""``hack/k8s-versions.sh``, the version matrix of the build scripts, agrees with the one the
dev cluster and the tests use (``hack.devcluster.config.K8S_VERSIONS``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hack.devcluster.config import K8S_VERSIONS

HACK = Path(__file__).resolve().parents[3] / "hack"


def _pick(*args: str, env_version: str = "") -> subprocess.CompletedProcess[str]:
    script = (
        f'. "{HACK}/k8s-versions.sh"\npick_k8s_version build-x "$@"\n'
        'echo "$minor $K8S_VERSION $kmod"\nk8s_ldflags'
    )
    env = {"PATH": "/usr/bin:/bin", **({"TRANCHE_K8S_VERSION": env_version} if env_version else {})}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script, "pick", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("minor", sorted(K8S_VERSIONS))
def test_each_minor_builds_the_release_of_the_matrix_from_its_module(minor: str) -> None:
    done = _pick("--version", minor)
    assert done.returncode == 0, done.stderr
    first, ldflags = done.stdout.splitlines()
    got_minor, release, kmod = first.split()
    assert (got_minor, release) == (minor, K8S_VERSIONS[minor])
    assert (Path(kmod) / "go.mod").is_file()
    assert f"k8s.io/kubernetes {release}" in (Path(kmod) / "go.mod").read_text()
    assert f"gitVersion={release}" in ldflags and f"gitMinor={minor.split('.')[1]}" in ldflags


def test_the_default_is_the_environment_then_137() -> None:
    assert _pick().stdout.split()[0] == "1.37"
    assert _pick(env_version="1.35").stdout.split()[0] == "1.35"
    assert _pick("--version=v1.34.4").stdout.split()[0] == "1.34"


def test_a_version_outside_the_matrix_names_the_step() -> None:
    done = _pick("--version", "1.33")
    assert done.returncode == 2
    assert "build-x: step 'pick version': Kubernetes '1.33' is not in the matrix" in done.stderr
