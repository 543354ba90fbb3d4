"""A simulated driver root: the NVIDIA driver's files by their real names, with stand-ins.

``--nvml simulated`` plugins look up the driver's files in a directory made here, so the
same code builds the same CDI specs as on a GPU node (:mod:`driver.prepare.driver_root`):

* ``usr/lib/x86_64-linux-gnu/<lib>.so.<driver version>`` for every compute and utility
  library (a few bytes of text: nothing can load them), with the links ``ldconfig`` makes
  (``libcuda.so.1``, ``libnvidia-nvvm.so.4``, ...) and the development link ``libcuda.so``;
  ``etc/ld.so.conf`` naming the directory (no ``ld.so.cache``: the directory scan finds
  them).
* ``usr/bin/nvidia-smi``: a POSIX shell script that prints the simulated GPUs (``-L`` the
  ``GPU <i>: <name> (UUID: ...)`` lines, without it a short table). Where GPU device nodes
  exist (a container), only the GPUs whose ``/dev/nvidia<minor>`` it has, as NVML finds
  them: a container of two claims sees both, whichever claim's ``NVIDIA_VISIBLE_DEVICES``
  the runtime kept. Without any (the node itself), those ``NVIDIA_VISIBLE_DEVICES`` names
  when it is set, else all.
* ``usr/bin/nvidia-cuda-mps-control``: the simulated MPS control daemon
  (:mod:`driver.nvml.sim.mps_control`), run by this Python interpreter;
  ``nvidia-cuda-mps-server``, ``nvidia-debugdump`` and ``nvidia-persistenced``: scripts that
  say what they are and exit 0.
* ``run/nvidia-persistenced/socket``: a placeholder for the persistence daemon's socket.
* ``dev/nvidia-modeset``: a placeholder that says the node has the modeset device (its
  numbers come from :class:`driver.prepare.cdi.DeviceNumbers`).

:func:`create_driver_root` is idempotent: every file is rewritten in place. It writes only
into an empty or missing directory, or one it wrote before (:data:`MARKER`, or the stand-in
library of a root written before the marker existed): a ``--driver-root`` that holds a real
driver (``/run/nvidia/driver`` given by mistake with ``--nvml simulated``) is refused, never
overwritten.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from driver.errors import ConfigError

LIB_DIR = "usr/lib/x86_64-linux-gnu"
# (library, soname link or None): the files a driver installs next to libcuda.
LIBRARIES: tuple[tuple[str, str | None], ...] = (
    ("libcuda.so", "libcuda.so.1"),
    ("libcudadebugger.so", "libcudadebugger.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
    ("libnvidia-opencl.so", "libnvidia-opencl.so.1"),
    ("libnvidia-gpucomp.so", None),
    ("libnvidia-allocator.so", "libnvidia-allocator.so.1"),
    ("libnvidia-cfg.so", "libnvidia-cfg.so.1"),
)
PLAIN_UTILITIES = ("nvidia-cuda-mps-server", "nvidia-debugdump", "nvidia-persistenced")


@dataclass(frozen=True)
class SimGpuLine:
    """What ``nvidia-smi`` shows of one simulated GPU."""

    index: int
    name: str
    uuid: str
    memory_mib: int
    minor: int  # /dev/nvidia<minor>


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def _link(path: Path, target: str) -> None:
    if path.is_symlink() and str(path.readlink()) == target:
        return
    tmp = path.with_name(f".{path.name}.lnk")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(path)


def nvidia_smi_script(gpus: Sequence[SimGpuLine], driver_version: str, cuda: str) -> str:
    """A POSIX ``sh`` ``nvidia-smi`` that prints ``gpus`` (busybox's sh runs it)."""
    rows = []
    for g in gpus:
        listing = f"GPU {g.index}: {g.name} (UUID: {g.uuid})"
        row = f"| {g.index:>3}  {g.name:<40} {g.uuid:<44} {g.memory_mib:>7}MiB |"
        rows.append(
            f"show {shlex.quote(g.uuid)} {g.index} {g.minor} "
            f"{shlex.quote(listing)} {shlex.quote(row)}"
        )
    return f"""#!/bin/sh
# Simulated nvidia-smi (Tranche): the node's simulated GPUs. Where GPU device nodes exist
# (a container), those whose /dev/nvidia<minor> is there, as NVML finds them; otherwise,
# with NVIDIA_VISIBLE_DEVICES set, only those it names (by UUID or index).
# TRANCHE_SIM_DEV_DIR stands in for /dev in tests.
visible="${{NVIDIA_VISIBLE_DEVICES:-all}}"
dev="${{TRANCHE_SIM_DEV_DIR:-/dev}}"
nodes=0
for f in "$dev"/nvidia[0-9]*; do
  if [ -e "$f" ]; then nodes=1; break; fi
done
list=0
[ "$1" = "-L" ] && list=1
show() {{
  if [ "$nodes" = 1 ]; then
    [ -e "$dev/nvidia$3" ] || return
  else
    case ",$visible," in
      *,all,*|*",$1,"*|*",$2,"*) ;;
      *) return ;;
    esac
  fi
  if [ "$list" = 1 ]; then echo "$4"; else echo "$5"; fi
}}
if [ "$list" = 0 ]; then
  echo "NVIDIA-SMI {driver_version}  Driver Version: {driver_version}  CUDA Version: {cuda}"
  echo "(simulated by Tranche)"
fi
{chr(10).join(rows)}
exit 0
"""


def write_mps_control(bin_dir: Path, *, python: str | None = None) -> Path:
    """``<bin_dir>/nvidia-cuda-mps-control``: the simulated MPS control daemon
    (:mod:`driver.nvml.sim.mps_control`), run by ``python`` (default: this interpreter) from
    the same ``driver`` package as the process that writes it (its directory comes first on
    the daemon's ``sys.path``), whatever the interpreter would import by default."""
    path = bin_dir / "nvidia-cuda-mps-control"
    code_root = str(Path(__file__).resolve().parents[3])
    _write(
        path,
        f"#!{python or sys.executable}\n"
        '"""Simulated nvidia-cuda-mps-control (Tranche): driver.nvml.sim.mps_control."""\n'
        "import sys\n\n"
        f"sys.path.insert(0, {code_root!r})\n"
        "from driver.nvml.sim.mps_control import main  # noqa: E402\n\n"
        "sys.exit(main())\n",
        0o755,
    )
    return path


def create_driver_root(
    root: Path,
    driver_version: str,
    cuda_version: str,
    gpus: Sequence[SimGpuLine],
    *,
    python: str | None = None,
) -> Path:
    """Write (or rewrite) the simulated driver root at ``root``; returns ``root``.
    :class:`ConfigError` where ``root`` holds files this module did not write."""
    _check_ours(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(MARKER_TEXT)
    lib_dir = root / LIB_DIR
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name, soname in LIBRARIES:
        real = f"{name}.{driver_version}"
        _write(lib_dir / real, f"simulated {real} (Tranche); not loadable\n")
        if soname is not None:
            _link(lib_dir / soname, real)
    _link(lib_dir / "libcuda.so", "libcuda.so.1")
    _write(root / "etc" / "ld.so.conf", f"/{LIB_DIR}\n")
    bin_dir = root / "usr" / "bin"
    _write(bin_dir / "nvidia-smi", nvidia_smi_script(gpus, driver_version, cuda_version), 0o755)
    write_mps_control(bin_dir, python=python)
    for name in PLAIN_UTILITIES:
        _write(
            bin_dir / name,
            f'#!/bin/sh\necho "{name} (simulated by Tranche): nothing to do"\nexit 0\n',
            0o755,
        )
    _write(root / "run" / "nvidia-persistenced" / "socket", "")
    _write(root / "dev" / "nvidia-modeset", "")
    return root


MARKER = ".tranche-simulated-driver-root"
MARKER_TEXT = "written by Tranche's simulated NVML (--nvml simulated); nothing here is a driver\n"
_STAND_IN = b"simulated "  # how every stand-in library begins (a real one: ELF)


def _check_ours(root: Path) -> None:
    """Refuse a ``root`` that holds anything but a simulated driver root."""
    try:
        entries = sorted(p.name for p in root.iterdir())
    except FileNotFoundError:
        return
    except NotADirectoryError as e:
        raise ConfigError(f"--driver-root {root}: not a directory") from e
    if not entries or MARKER in entries:
        return
    try:
        with (root / LIB_DIR / "libcuda.so.1").open("rb") as f:
            if f.read(len(_STAND_IN)) == _STAND_IN:
                return  # written before the marker existed
    except OSError:
        pass
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    raise ConfigError(
        f"--driver-root {root}: holds files the simulated driver did not write ({shown}); "
        "--nvml simulated writes its stand-in libraries and tools there and would overwrite "
        "a real driver: give an empty directory (TRANCHE_DRIVER_ROOT, the chart's "
        "kubeletPlugin.driverRoot)"
    )
