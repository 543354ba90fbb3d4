"""A simulated ``nvidia-cuda-mps-control``: the control daemon and its client, no CUDA.

Shipped in the simulated driver root (:mod:`driver.nvml.sim.driver_root`) as
``usr/bin/nvidia-cuda-mps-control``, so the plugin starts it exactly as the real one:

* ``nvidia-cuda-mps-control -d`` daemonizes (fork, ``setsid``, the first process exits 0);
  the daemon listens on ``$CUDA_MPS_PIPE_DIRECTORY/control`` (a Unix socket) and writes
  ``control.log`` in ``$CUDA_MPS_LOG_DIRECTORY`` as the real one does. A second daemon on a
  pipe directory whose daemon answers refuses to start (exit 1), as the real one does.
* ``echo CMD | nvidia-cuda-mps-control`` sends each stdin line to the daemon and prints the
  answers; it exits 1 when no daemon answers. Commands: ``quit`` (the daemon exits),
  ``get_server_list`` (the pids of its servers: none, there is no CUDA client),
  ``set_default_active_thread_percentage <pct>``, ``get_default_active_thread_percentage``,
  ``set_default_device_pinned_mem_limit <dev> <N>M``, ``get_default_device_pinned_mem_limit
  <dev>``; anything else is answered with an error line, as the real one does.

For tests the daemon also appends every command to ``commands.log`` and its start (pid,
``CUDA_VISIBLE_DEVICES``) to ``starts.log`` in the log directory; started with
``TRANCHE_MPS_SHM`` (the plugin gave it a ``/dev/shm`` shared with its clients) it writes its
pid to ``/dev/shm/tranche-mps-daemon`` and removes it at ``quit``, as the real server leaves
its shared memory there for the clients to map. Fault knobs (environment
of ``-d``): ``TRANCHE_SIM_MPS_FAIL_START=1`` makes the start fail (exit 1),
``TRANCHE_SIM_MPS_SLOW_START=<seconds>`` delays the control socket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path

CONNECT_TIMEOUT_S = 5.0
SHM_MARK = Path("/dev/shm/tranche-mps-daemon")
SHM_ENV = "TRANCHE_MPS_SHM"
FAIL_START = "TRANCHE_SIM_MPS_FAIL_START"
SLOW_START = "TRANCHE_SIM_MPS_SLOW_START"


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")).absolute()
    logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")).absolute()
    return pipe, logs


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


class _Daemon:
    def __init__(self, pipe: Path, logs: Path) -> None:
        self.pipe = pipe
        self.logs = logs
        self.thread_percentage = "100.0"
        self.mem_limits: dict[str, str] = {}

    def answer(self, command: str) -> tuple[str, bool]:
        """The reply to one command and whether the daemon goes on."""
        words = command.split()
        name, args = words[0], words[1:]
        if name == "quit":
            return "", False
        if name == "get_server_list":
            return "", True
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            self.thread_percentage = f"{float(args[0]):.1f}"
            return self.thread_percentage, True
        if name == "get_default_active_thread_percentage" and not args:
            return self.thread_percentage, True
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self.mem_limits[args[0]] = args[1]
            return "", True
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return self.mem_limits.get(args[0], "0M"), True
        return f"Unrecognized command: {command}", True

    def serve(self) -> None:
        # Bound by a relative name: a Unix socket path must stay under 108 bytes, and the
        # pipe directory may be deep (a test's temporary directory).
        shared = bool(os.environ.get(SHM_ENV))
        if shared:  # before the control socket: a client that connects finds it
            SHM_MARK.write_text(f"{os.getpid()}\n")
        os.chdir(self.pipe)
        control = Path("control")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(control))
        server.listen(16)
        _append(
            self.logs / "starts.log",
            f"pid={os.getpid()} devices={os.environ.get('CUDA_VISIBLE_DEVICES', '')}",
        )
        _append(self.logs / "control.log", f"[{time.ctime()}] Control daemon started")
        running = True
        while running:
            conn, _ = server.accept()
            with conn, conn.makefile("rw") as stream:
                for line in stream:
                    command = line.strip()
                    if not command:
                        continue
                    _append(self.logs / "commands.log", command)
                    _append(self.logs / "control.log", f"[{time.ctime()}] Cmd:{command}")
                    reply, running = self.answer(command)
                    stream.write(reply + "\n")
                    stream.flush()
                    if not running:
                        break
        server.close()
        control.unlink(missing_ok=True)
        if shared:
            SHM_MARK.unlink(missing_ok=True)
        _append(self.logs / "control.log", f"[{time.ctime()}] Control daemon exited")


def _connect(pipe: Path, timeout_s: float = CONNECT_TIMEOUT_S) -> socket.socket | None:
    """Connect to the daemon (from the pipe directory: the socket's path may be long)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        os.chdir(pipe)
        sock.connect("control")
    except OSError:
        sock.close()
        return None
    return sock


def start_daemon() -> int:
    pipe, logs = _dirs()
    if os.environ.get(FAIL_START) == "1":
        print(f"nvidia-cuda-mps-control (simulated): start refused ({FAIL_START})", file=sys.stderr)
        return 1
    live = _connect(pipe, 1.0)
    if live is not None:
        live.close()
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    (pipe / "control").unlink(missing_ok=True)
    if os.fork() > 0:
        return 0
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    delay = float(os.environ.get(SLOW_START, "0") or 0)
    if delay > 0:
        time.sleep(delay)  # a fault knob: a daemon slow to open its control socket
    with contextlib.suppress(OSError):
        _Daemon(pipe, logs).serve()
    os._exit(0)


def send(lines: list[str]) -> int:
    pipe, _ = _dirs()
    sock = _connect(pipe)
    if sock is None:
        print(
            "Cannot find MPS control daemon process (simulated: nothing answers on "
            f"{pipe / 'control'})",
            file=sys.stderr,
        )
        return 1
    with sock, sock.makefile("rw") as stream:
        for line in lines:
            if not line.strip():
                continue
            stream.write(line.strip() + "\n")
            stream.flush()
            reply = stream.readline()
            if not reply:
                return 0 if line.strip() == "quit" else 1
            if reply.strip():
                print(reply.rstrip("\n"))
            if line.strip() == "quit":
                break
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["-d"]:
        return start_daemon()
    if args:
        print(f"nvidia-cuda-mps-control (simulated): unsupported arguments {args}", file=sys.stderr)
        return 1
    return send(sys.stdin.read().splitlines())


if __name__ == "__main__":
    sys.exit(main())
