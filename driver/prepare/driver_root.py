"""The NVIDIA driver's files a CUDA container needs, found once at start from the driver root.

The driver root is where the plugin sees the host's driver installation (``--driver-root``:
``/`` on a node with the driver installed on the host, the chart's ``/driver-root`` mount in
the plugin pod, a simulated driver root with ``--nvml simulated``). ``host_root`` is the
same directory as the host sees it (``--host-driver-root``): CDI ``hostPath`` values are
host paths, container paths are the paths inside the driver root.

What is found, as NVIDIA's container toolkit finds it (``gpu-facts.md`` §7):

* **Libraries** (compute and utility: ``libcuda``, ``libnvidia-ml``, ``libnvidia-ptxjitcompiler``,
  ``libcudadebugger``, ``libnvidia-nvvm``, ...): ``libcuda.so.1`` is looked up as the dynamic
  loader would, in the driver root's ``etc/ld.so.cache`` and then its standard library
  directories; the file it resolves to (``libcuda.so.570.133.20``) gives the driver version,
  and every other library is the file ``<name>.so.<version>`` next to it. The links the
  host's ``ldconfig`` made to each file (``libcuda.so.1``, ``libnvidia-nvvm.so.4``) and the
  development link ``libcuda.so`` are what the container needs to load them by soname.
* **Utilities** ``nvidia-smi``, ``nvidia-cuda-mps-control``, ``nvidia-cuda-mps-server``,
  ``nvidia-debugdump``, ``nvidia-persistenced`` from the standard binary directories.
* **IPC sockets** that exist: ``nvidia-persistenced``, ``nvidia-fabricmanager``.
* **GSP firmware** ``lib/firmware/nvidia/<version>`` when present.
* **Control device nodes** ``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``, and
  ``nvidia-modeset`` where ``<driver root>/dev`` has it. (Each GPU's node and the MIG
  capability nodes are per claim, in :mod:`driver.prepare.cdi`.)

How the libraries become loadable in the container:

* With ``nvidia-cdi-hook`` (``--cdi-hook-path``, or found in the driver root's binary
  directories): the versioned files are bind-mounted at their paths, a ``createContainer``
  hook ``create-symlinks`` makes the soname links and ``update-ldcache`` adds the library
  directories to the container's ``/etc/ld.so.cache``.
* Without it: each versioned file is also bind-mounted under each of its link names
  (``libcuda.so.1``, ``libcuda.so``) in the same directory, so nothing has to be created in the
  container. The loader then finds ``libcuda.so.1`` when that directory is one it searches:
  the multiarch directory (``/usr/lib/x86_64-linux-gnu``) is in the ``ld.so.cache`` of
  Debian- and Ubuntu-based images; for other images (and images without a cache, e.g.
  busybox) the pod sets ``LD_LIBRARY_PATH`` to it.

Nothing here runs per prepare: :func:`find_driver_files` reads the file system once and the
plugin keeps the resulting :class:`~driver.prepare.cdi.ContainerEdits`.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from driver.prepare.cdi import CONTROL_NODES, ContainerEdits, Hook, Mount

log = logging.getLogger(__name__)

# Compute and utility libraries, by the name before ``.so.<version>`` (toolkit ``nvcdi``).
LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nscq.so",
)
REQUIRED_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
# Sonames (ELF DT_SONAME) of the libraries that have a stable one: the link made when the
# host's ldconfig made none.
SONAMES = {
    "libcuda.so": "libcuda.so.1",
    "libcudadebugger.so": "libcudadebugger.so.1",
    "libnvidia-ml.so": "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
    "libnvidia-opencl.so": "libnvidia-opencl.so.1",
    "libnvidia-allocator.so": "libnvidia-allocator.so.1",
    "libnvidia-cfg.so": "libnvidia-cfg.so.1",
}
UTILITIES = (
    "nvidia-smi",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-debugdump",
    "nvidia-persistenced",
)
SOCKETS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket")
OPTIONAL_NODES = ("/dev/nvidia-modeset",)
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib",
    "/lib",
)
BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin")
CDI_HOOK = "nvidia-cdi-hook"
LD_CACHE = "/etc/ld.so.cache"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
_VERSION = re.compile(r"^\d+(\.\d+)+$")
_LD_CACHE_NEW = b"glibc-ld.so.cache1.1"
_LD_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, ext
_LD_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
# ld.so.cache entry flags of 64-bit libraries per machine (glibc ``ldconfig.h``).
_ARCH_FLAGS = {"x86_64": 0x0303, "aarch64": 0x0A03}


class DriverRootError(Exception):
    """The driver root lacks what a CUDA container cannot do without."""


@dataclass(frozen=True)
class Library:
    """One driver library: its file, and the links to it a loader needs (name -> target)."""

    path: str  # in the driver root, e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.570.133.20
    links: tuple[tuple[str, str], ...] = ()  # ("libcuda.so.1", "libcuda.so.570.133.20"), ...

    @property
    def dir(self) -> str:
        return str(PurePosixPath(self.path).parent)


@dataclass(frozen=True)
class DriverFiles:
    """What :func:`find_driver_files` found, as paths inside the driver root."""

    root: Path
    host_root: str
    version: str | None
    libraries: tuple[Library, ...] = ()
    utilities: tuple[str, ...] = ()
    sockets: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = CONTROL_NODES
    hook: str | None = None  # host path of nvidia-cdi-hook
    missing: tuple[str, ...] = field(default=())

    def host(self, path: str) -> str:
        """The host path of ``path`` (a path inside the driver root)."""
        return str(PurePosixPath(self.host_root) / path.lstrip("/"))

    def library(self, name: str) -> Library | None:
        """The library whose file starts with ``name`` (``libcuda.so``)."""
        for lib in self.libraries:
            if PurePosixPath(lib.path).name.startswith(name + "."):
                return lib
        return None

    def edits(self) -> ContainerEdits:
        """The CDI container edits: mounts, device nodes, hooks (see the module docstring)."""
        mounts: list[Mount] = []
        for lib in self.libraries:
            mounts.append(Mount(self.host(lib.path), lib.path, MOUNT_OPTIONS))
            if self.hook is None:
                mounts += [
                    Mount(self.host(lib.path), f"{lib.dir}/{name}", MOUNT_OPTIONS)
                    for name, _ in lib.links
                ]
        for path in (*self.utilities, *self.sockets, *self.firmware):
            mounts.append(Mount(self.host(path), path, MOUNT_OPTIONS))
        hooks: list[Hook] = []
        if self.hook is not None and self.libraries:
            links = [
                f"{target}::{lib.dir}/{name}"
                for lib in self.libraries
                for name, target in lib.links
            ]
            if links:
                args = [CDI_HOOK, "create-symlinks"]
                for link in links:
                    args += ["--link", link]
                hooks.append(Hook("createContainer", self.hook, tuple(args)))
            folders: list[str] = []
            for lib in self.libraries:
                if lib.dir not in folders:
                    folders.append(lib.dir)
            args = [CDI_HOOK, "update-ldcache"]
            for folder in folders:
                args += ["--folder", folder]
            hooks.append(Hook("createContainer", self.hook, tuple(args)))
        env: tuple[str, ...] = ()
        cuda = self.library("libcuda.so")
        if cuda is not None:
            env = (f"NVIDIA_CTK_LIBCUDA_DIR={cuda.dir}",)
        return ContainerEdits(
            env=env, device_nodes=self.device_nodes, mounts=tuple(mounts), hooks=tuple(hooks)
        )


def read_ld_cache(data: bytes, machine: str | None = None) -> dict[str, str]:
    """Soname -> path from an ``ld.so.cache`` (glibc's new format, with or without the old
    header in front); the machine's 64-bit entries win over others of the same name."""
    start = data.find(_LD_CACHE_NEW)
    if start < 0 or len(data) < start + _LD_HEADER.size:
        return {}
    _, nlibs, _, _, _ = _LD_HEADER.unpack_from(data, start)
    want = _ARCH_FLAGS.get(machine or platform.machine())
    found: dict[str, tuple[bool, str]] = {}
    offset = start + _LD_HEADER.size
    for i in range(nlibs):
        at = offset + i * _LD_ENTRY.size
        if at + _LD_ENTRY.size > len(data):
            break
        flags, key, value, _, _ = _LD_ENTRY.unpack_from(data, at)
        name, path = _cstring(data, start + key), _cstring(data, start + value)
        if not name or not path:
            continue
        preferred = want is None or flags == want
        if name not in found or (preferred and not found[name][0]):
            found[name] = (preferred, path)
    return {name: path for name, (_, path) in found.items()}


def _cstring(data: bytes, at: int) -> str:
    if not 0 <= at < len(data):
        return ""
    end = data.find(b"\0", at)
    return data[at : end if end >= 0 else len(data)].decode(errors="replace")


def _inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _resolve(root: Path, path: str, hops: int = 40) -> str | None:
    """``path`` (inside ``root``) with its symlinks followed inside ``root``; None if absent."""
    current = PurePosixPath(path)
    for _ in range(hops):
        real = _inside(root, str(current))
        if real.is_symlink():
            target = PurePosixPath(real.readlink())
            current = target if target.is_absolute() else current.parent / target
            continue
        return str(current) if real.is_file() else None
    return None


def _links_to(root: Path, lib_path: str, name: str) -> tuple[tuple[str, str], ...]:
    """The links in the library's directory, named ``name[.N]``, that resolve to it."""
    directory = PurePosixPath(lib_path).parent
    file_name = PurePosixPath(lib_path).name
    links = []
    try:
        entries = sorted(_inside(root, str(directory)).iterdir())
    except OSError:
        return ()
    for entry in entries:
        if entry.name == file_name or not entry.is_symlink():
            continue
        if entry.name != name and not entry.name.startswith(name + "."):
            continue
        if _resolve(root, str(directory / entry.name)) == lib_path:
            links.append((entry.name, str(entry.readlink())))
    if not links and name in SONAMES:
        links.append((SONAMES[name], file_name))
    return tuple(links)


def _find_libcuda(root: Path, cache: dict[str, str]) -> str | None:
    for candidate in (cache.get("libcuda.so.1"), *(f"{d}/libcuda.so.1" for d in LIB_DIRS)):
        if candidate and (resolved := _resolve(root, candidate)) is not None:
            return resolved
    for d in LIB_DIRS:
        directory = _inside(root, d)
        if directory.is_dir():
            for f in sorted(directory.glob("libcuda.so.*")):
                if _VERSION.match(f.name.removeprefix("libcuda.so.")) and not f.is_symlink():
                    return f"{d}/{f.name}"
    return None


def _find_hook(root: Path, host_root: str, hook_path: str | None) -> str | None:
    if hook_path:
        return hook_path
    for d in BIN_DIRS:
        if os.access(_inside(root, f"{d}/{CDI_HOOK}"), os.X_OK):
            return str(PurePosixPath(host_root) / d.lstrip("/") / CDI_HOOK)
    return None


def find_driver_files(
    root: Path, host_root: str | None = None, *, hook_path: str | None = None
) -> DriverFiles:
    """Look the driver's files up under ``root`` (once, at start).

    ``hook_path``: the host path of ``nvidia-cdi-hook`` when it is not in the driver root;
    ``""`` or None looks in the driver root's binary directories.
    """
    host_root = host_root or str(root)
    try:
        cache = read_ld_cache(_inside(root, LD_CACHE).read_bytes())
    except OSError:
        cache = {}
    libcuda = _find_libcuda(root, cache)
    version = PurePosixPath(libcuda).name.removeprefix("libcuda.so.") if libcuda else None
    libraries: list[Library] = []
    missing: list[str] = []
    if libcuda and version:
        dirs = [str(PurePosixPath(libcuda).parent)]
        dirs += [str(PurePosixPath(p).parent) for p in cache.values()]
        dirs += list(LIB_DIRS)
        for name in LIBRARIES:
            for d in dict.fromkeys(dirs):
                path = f"{d}/{name}.{version}"
                if _inside(root, path).is_file() and not _inside(root, path).is_symlink():
                    libraries.append(Library(path, _links_to(root, path, name)))
                    break
            else:
                if name in REQUIRED_LIBRARIES:
                    missing.append(f"{name}.{version}")
    else:
        missing.append("libcuda.so.1")
    utilities = []
    for name in UTILITIES:
        for d in BIN_DIRS:
            if _inside(root, f"{d}/{name}").is_file():
                utilities.append(f"{d}/{name}")
                break
    sockets = tuple(s for s in SOCKETS if _inside(root, s).exists())
    firmware = tuple(
        f
        for f in ([f"/lib/firmware/nvidia/{version}"] if version else [])
        if _inside(root, f).is_dir()
    )
    nodes = CONTROL_NODES + tuple(n for n in OPTIONAL_NODES if _inside(root, n).exists())
    files = DriverFiles(
        root=root,
        host_root=host_root,
        version=version,
        libraries=tuple(libraries),
        utilities=tuple(utilities),
        sockets=sockets,
        firmware=firmware,
        device_nodes=nodes,
        hook=_find_hook(root, host_root, hook_path),
        missing=tuple(missing),
    )
    log.info(
        "driver root root=%s host_root=%s version=%s libraries=%d utilities=%s sockets=%s "
        "hook=%s missing=%s",
        root,
        host_root,
        version,
        len(files.libraries),
        ",".join(PurePosixPath(u).name for u in files.utilities) or "-",
        ",".join(files.sockets) or "-",
        files.hook or "-",
        ",".join(files.missing) or "-",
    )
    return files
