"""What a real node does to the machine, recorded before it happens and undone on teardown.

Machine-wide (shared by every real node of one cluster, recorded once in
``<state>/n/host.json`` when the first real node starts, undone after the last one is gone):

* sysctls the kubelet sets at start (``vm.overcommit_memory``, ``kernel.panic``, ...):
  the original values are restored;
* machine paths the kubelet, containerd or CNI create whatever their configuration says
  (``/var/log/containers``, ``/var/lib/cni``, ``/run/containerd/s`` for shim sockets, ...):
  the ones that did not exist before are removed.

Per node (derived from ``node.json``): processes in the node's cgroup root and containerd
shims started for its socket are killed; every mount under the node's directory is
unmounted; the cgroup root is removed from every hierarchy; the CNI bridge and its
veth links are deleted.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from hack.devcluster.errors import ClusterError

log = logging.getLogger(__name__)

# Set by the kubelet's container manager (setupKernelTunables) unless protectKernelDefaults;
# ip_forward is listed in case a CNI plugin switches it on.
WATCHED_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)

# Created by the kubelet (hard-coded /var/log/containers), by containerd (/run/containerd/s
# holds shim sockets whatever its state dir is), by libcni (/var/lib/cni/results), or by
# defaults we do not expect to hit (listed so a surprise is still cleaned up).
WATCHED_PATHS = (
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/kubelet",
    "/usr/libexec/kubernetes",
    "/var/lib/cni",
    "/run/containerd",
    "/var/lib/containerd",
    "/etc/cni",
    "/opt/cni",
    "/etc/cdi",
    "/run/cdi",
)

_MNT_DETACH = 2
_SYSCTL_ROOT = Path("/proc/sys")


# --- machine-wide record ------------------------------------------------------------------


def read_sysctls(names: Iterable[str] = WATCHED_SYSCTLS) -> dict[str, str]:
    values = {}
    for name in names:
        with contextlib.suppress(OSError):
            values[name] = (_SYSCTL_ROOT / name).read_text().strip()
    return values


# Clusters (state dirs) with real nodes on this machine, one file each; the first records
# the machine's original state, later ones copy it, the last one out restores it. On tmpfs:
# a reboot resets sysctls and /run alike.
REGISTRY = Path("/run/tranche-real-nodes")


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    # flock on /run itself: serialises clusters without leaving a lock file behind.
    fd = os.open("/run", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _entry(record_file: Path) -> Path:
    return REGISTRY / (hashlib.sha256(str(record_file).encode()).hexdigest()[:16] + ".json")


def _live_others(record_file: Path) -> list[Path]:
    """Record files of other clusters that still have real nodes (stale entries dropped)."""
    live = []
    for entry in sorted(REGISTRY.glob("*.json")) if REGISTRY.is_dir() else []:
        try:
            other = Path(json.loads(entry.read_text())["record"])
        except (OSError, ValueError, KeyError):
            entry.unlink(missing_ok=True)
            continue
        if other == record_file:
            continue
        if other.exists():
            live.append(other)
        else:
            entry.unlink(missing_ok=True)
    return live


def record_machine(record_file: Path) -> None:
    """Write this cluster's machine record unless it exists (a running node wrote it).

    When another cluster on the machine already runs real nodes, its record (the state
    before any of them) is copied: the current values are already changed.
    """
    with _machine_lock():
        if record_file.exists():
            return
        others = _live_others(record_file)
        if others:
            record = json.loads(others[0].read_text())
        else:
            record = {
                "sysctls": read_sysctls(),
                "absent_paths": [p for p in WATCHED_PATHS if not os.path.lexists(p)],
            }
        record_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = record_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
        tmp.replace(record_file)
        REGISTRY.mkdir(exist_ok=True)
        _entry(record_file).write_text(json.dumps({"record": str(record_file)}))
        log.info("recorded host state file=%s copied_from=%s", record_file, others[:1])


def restore_machine(record_file: Path) -> list[str]:
    """Undo the machine-wide effects in ``record_file`` and delete it; returns what changed.

    While another cluster still runs real nodes, only this cluster's record goes: the last
    cluster out restores the machine.
    """
    with _machine_lock():
        try:
            record = json.loads(record_file.read_text())
        except FileNotFoundError:
            return []
        record_file.unlink()
        _entry(record_file).unlink(missing_ok=True)
        others = _live_others(record_file)
        if others:
            log.info("host restore left to another cluster record=%s", others[0])
            return []
        undone = []
        for name, value in record.get("sysctls", {}).items():
            path = _SYSCTL_ROOT / name
            try:
                if path.read_text().strip() != value:
                    path.write_text(value)
                    undone.append(f"sysctl {name.replace('/', '.')}={value}")
            except OSError as e:
                log.warning("cannot restore sysctl name=%s value=%s error=%s", name, value, e)
        for p in record.get("absent_paths", []):
            if os.path.lexists(p):
                unmount_under(Path(p))
                shutil.rmtree(p, ignore_errors=True)
                undone.append(f"removed {p}")
        with contextlib.suppress(OSError):
            REGISTRY.rmdir()
        for item in undone:
            log.info("host restored what=%r", item)
        return undone


# --- mounts --------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` (deepest first)."""
    base = str(path.resolve()) if path.exists() else str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == base or point.startswith(base.rstrip("/") + "/"):
            found.append(Path(point))
    return sorted(set(found), key=lambda p: (len(p.parts), str(p)), reverse=True)


def unmount_under(path: Path) -> list[Path]:
    """Lazily unmount everything at or below ``path``; returns what was unmounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    done: list[Path] = []
    for _ in range(20):  # stacked mounts (the kubelet's rshared self-bind) need rounds
        points = mounts_under(path)
        if not points:
            break
        for point in points:
            if libc.umount2(str(point).encode(), _MNT_DETACH) == 0:
                done.append(point)
            else:
                err = ctypes.get_errno()
                log.warning("umount failed path=%s errno=%d (%s)", point, err, os.strerror(err))
    return done


# --- cgroups -------------------------------------------------------------------------------


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        if fstype in {"cgroup", "cgroup2"}:
            found.append(Path(_unescape(left.split()[4])))
    return found


def create_cgroup(root: str) -> list[Path]:
    """Create ``root`` (e.g. ``/tranche-n1``) in every hierarchy; the kubelet requires it."""
    made = []
    for h in cgroup_hierarchies():
        d = h / root.lstrip("/")
        d.mkdir(exist_ok=True)
        made.append(d)
        # A new cpuset cgroup (v1) has no cpus/mems; tasks cannot join until set.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            mine, parent = d / knob, h / knob
            if mine.exists() and not mine.read_text().strip() and parent.exists():
                mine.write_text(parent.read_text().strip())
    return made


def _cgroup_dirs(root: str) -> list[Path]:
    dirs: list[str] = []
    for h in cgroup_hierarchies():
        top = h / root.lstrip("/")
        if top.is_dir():
            dirs.extend(p for p, _, _ in os.walk(top))
    return [Path(d) for d in dirs]


def cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs(root):
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return pids


def kill_cgroup(root: str, *, timeout_s: float = 10.0) -> set[int]:
    """SIGKILL every process in ``root``'s cgroups until none is left; returns the pids."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        pids = cgroup_pids(root)
        if not pids:
            return killed
        if time.monotonic() > deadline:
            log.warning("processes survive in cgroup root=%s pids=%s", root, sorted(pids))
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.1)


def remove_cgroup(root: str) -> list[Path]:
    """rmdir ``root`` and everything below it, deepest first, in every hierarchy."""
    removed = []
    for d in sorted(_cgroup_dirs(root), key=lambda p: len(p.parts), reverse=True):
        for _ in range(50):  # a cgroup whose last task just died can be busy briefly
            try:
                d.rmdir()
                removed.append(d)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                last = e
                time.sleep(0.05)
        else:
            log.warning("cannot remove cgroup path=%s error=%s", d, last)
    return removed


# --- processes -----------------------------------------------------------------------------


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (never this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def kill_marked(marker: str, *, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process whose command line names ``marker``; wait until they are gone."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while (pids := processes_with(marker)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.1)
    return killed


# --- links ---------------------------------------------------------------------------------


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def create_bridge(name: str, mac: str) -> None:
    """The bridge ``name`` (up), its MAC set to ``mac`` before any pod's link joins it.

    A Linux bridge whose MAC was never set takes the lowest MAC of its ports, and takes
    another when that port leaves. A pod's neighbour entry for the gateway (the bridge's
    address) then names a MAC that is nowhere: the pod's packets to the gateway, and its
    answers to the kubelet's probes, are lost until the entry expires, up to about a minute.
    The CNI bridge plugin (1.1.1) does not set one; it adopts a bridge that exists."""
    if not link_exists(name):
        _ip_link("add", "name", name, "type", "bridge")
    _ip_link("set", "dev", name, "address", mac)
    _ip_link("set", "dev", name, "up")


def _ip_link(*args: str) -> None:
    done = subprocess.run(["ip", "link", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"ip link {' '.join(args)}", done.stderr.strip())


def delete_bridge(name: str) -> list[str]:
    """Delete the bridge ``name`` and the (host ends of the) links attached to it."""
    deleted = []
    brif = Path("/sys/class/net", name, "brif")
    members = sorted(p.name for p in brif.iterdir()) if brif.is_dir() else []
    for link in [*members, name]:
        if not link_exists(link):
            continue
        done = subprocess.run(
            ["ip", "link", "delete", link], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            deleted.append(link)
        elif link_exists(link):  # a veth goes away by itself when its pod netns does
            log.warning("cannot delete link name=%s error=%s", link, done.stderr.strip())
    return deleted
