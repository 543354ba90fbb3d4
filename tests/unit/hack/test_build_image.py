"""``hack/build-image.sh``'s cache, run on a copy of the script in a small fake repository with
a fake ``buildah`` (it records images and tags in a directory; a build takes no time): what the
script serves from the cache, what it leaves in buildah's storage, and how it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[3] / "hack"

# Images are files under $FAKE_STATE/images, the tag's image id is in $FAKE_STATE/tag.
FAKE_BUILDAH = r"""#!/usr/bin/env bash
set -eu
state=$FAKE_STATE
mkdir -p "$state/images"
case $1 in
  pull) exit 0 ;;
  inspect) exit 1 ;;
  bud)
    id=sha256:$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    : >"$state/images/$id"
    echo "$id" >"$state/tag"
    prev=""
    for arg in "$@"; do [ "$prev" = --iidfile ] && echo "$id" >"$arg"; prev=$arg; done ;;
  push)
    src=$2; [ "${src#sha256:}" != "$src" ] || src=$(cat "$state/tag")
    dest=${3#oci-archive:}; dest=${dest%%:*}
    echo "image $src" >"$dest" ;;
  images)
    case " $* " in
      *" --quiet "*) [ ! -f "$state/tag" ] || cat "$state/tag" ;;
      *) echo 1MB ;;
    esac ;;
  rmi) rm "$state/images/$2" ;;
  *) exit 0 ;;
esac
"""


@dataclass
class Repo:
    root: Path
    env: dict[str, str]
    state: Path
    cache: Path

    def build(self, limit_kib: int | None = None) -> subprocess.CompletedProcess[str]:
        """Run the script; ``limit_kib`` caps the size of each file it writes (a full disk)."""
        script = str(self.root / "hack" / "build-image.sh")
        argv = ["bash", "-c", f'ulimit -f {limit_kib}; exec "{script}"'] if limit_kib else [script]
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=60, check=False
        )

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.root / "hack" / "build-image.sh")],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def images(self) -> list[str]:
        return sorted(p.name for p in (self.state / "images").iterdir())

    def entry(self) -> Path:
        """The one finished cache entry."""
        [stamp] = self.cache.glob("image-*/.stamp")
        return stamp.parent


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    root = tmp_path / "repo"
    (root / "hack").mkdir(parents=True)
    for name in ("build-image.sh", "cache-lib.sh"):
        shutil.copy2(HACK / name, root / "hack" / name)
    (root / "deploy").mkdir()
    (root / "deploy" / "Containerfile").write_text("FROM scratch\n")
    (root / "pyproject.toml").write_text('[project]\nversion = "0.1.0"\n')
    (root / "README.md").write_text("readme\n")
    (root / "LICENSE").write_text("license\n")
    (root / "driver").mkdir()
    (root / "driver" / "code.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    fakes = tmp_path / "bin"
    fakes.mkdir()
    (fakes / "buildah").write_text(FAKE_BUILDAH)
    (fakes / "sudo").write_text('#!/bin/sh\nexec "$@"\n')  # a run as another user than root
    for fake in fakes.iterdir():
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANCHE_")}
    env.update(
        PATH=f"{fakes}:{os.environ['PATH']}",
        TRANCHE_CACHE_DIR=str(tmp_path / "cache"),
        FAKE_STATE=str(tmp_path / "state"),
    )
    return Repo(root, env, tmp_path / "state", tmp_path / "cache")


def test_a_build_caches_its_archive_and_a_second_run_serves_it(repo: Repo) -> None:
    first = repo.build()
    assert first.returncode == 0, first.stderr
    dist = repo.root / "dist" / "tranche-image.tar"
    assert first.stdout.splitlines()[-1] == str(dist)
    built = dist.read_text()
    second = repo.build()
    assert second.returncode == 0, second.stderr
    assert "cached in" in second.stderr
    assert dist.read_text() == built
    assert len(repo.images()) == 1


def test_a_new_build_removes_the_image_it_untagged_from_buildahs_storage(repo: Repo) -> None:
    for n in range(3):
        (repo.root / "driver" / "code.py").write_text(f"x = {n}\n")
        done = repo.build()
        assert done.returncode == 0, done.stderr
    # One image in buildah's storage, the tagged one, and it is the one in the archive.
    tagged = (repo.state / "tag").read_text().strip()
    assert repo.images() == [tagged]
    dist = repo.root / "dist" / "tranche-image.tar"
    assert dist.read_text() == f"image {tagged}\n"


def test_a_cache_hit_on_a_full_disk_fails_instead_of_serving_the_previous_archive(
    repo: Repo,
) -> None:
    assert repo.build().returncode == 0
    entry = repo.entry()
    # The cached archive is bigger than what the disk still takes.
    (entry / "tranche-image.tar").write_bytes(b"new sources" + bytes(64 * 1024))
    dist = repo.root / "dist" / "tranche-image.tar"
    dist.write_text("an image of other sources\n")
    done = repo.build(limit_kib=16)
    assert done.returncode == 1, done.stdout
    assert "build-image: step 'publish' failed: cannot copy" in done.stderr
    assert done.stdout == ""
    assert dist.read_text() == "an image of other sources\n"  # untouched, and not printed
    assert [p.name for p in dist.parent.iterdir()] == ["tranche-image.tar"]  # no temporary left


def test_two_cache_hits_at_once_both_get_the_whole_archive(repo: Repo) -> None:
    assert repo.build().returncode == 0
    archive = repo.entry() / "tranche-image.tar"
    content = os.urandom(32 * 1024 * 1024)
    archive.write_bytes(content)
    for _ in range(3):
        runs = [repo.start(), repo.start()]
        for run in runs:
            out, err = run.communicate(timeout=60)
            assert run.returncode == 0, err
            assert Path(out.splitlines()[-1]).read_bytes() == content


def test_an_interrupted_build_is_built_again_not_served(repo: Repo) -> None:
    fake = Path(repo.env["PATH"].split(":")[0]) / "buildah"
    real_fake = fake.read_text()
    fake.write_text(real_fake.replace("  push)\n", "  push)\n    exit 125\n"))
    failed = repo.build()
    assert failed.returncode == 1
    assert "build-image: step 'buildah push oci-archive' failed" in failed.stderr
    assert not list(repo.cache.glob("image-*/.stamp"))
    assert not (repo.root / "dist").exists()
    fake.write_text(real_fake)
    again = repo.build()
    assert again.returncode == 0, again.stderr
    assert "cached in" not in again.stderr
    assert (repo.entry() / "tranche-image.tar").read_text().startswith("image sha256:")
