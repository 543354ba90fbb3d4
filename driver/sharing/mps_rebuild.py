"""MPS: a daemon's record (``daemon.json``) written again when it cannot be read, for
:mod:`driver.sharing.mps_daemons`.

Only from what is known for certain: what the daemon serves (key, GPU, whole GPU or not,
daemon-wide defaults) from the prepared claims that use it, the device it sees and its
``/dev/shm`` from its processes' environment (found in ``/proc`` by their marks), its pipe
directory from its key. A daemon that answers on its pipe but none of whose processes can
be seen (another PID namespace) is not rebuilt: which ``/dev/shm`` it has is unknown, and a
wrong one would hand the claims that join it a directory their server does not use. A dead
one is recorded as its claims want it, so that the supervisor starts it again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from driver.sharing.mps_pipe import DaemonPipes
from driver.sharing.mps_procs import proc_environ
from driver.sharing.mps_records import DaemonSpec
from driver.sharing.mps_shm import ENV_SHM

DEVICE = "CUDA_VISIBLE_DEVICES"


def rebuild(daemons: DaemonPipes, spec: DaemonSpec) -> str | None:
    """Write the record of the daemon of ``spec.key`` (``spec``: what its prepared claims
    ask of it); None once written, else why it cannot be."""
    pids = daemons.processes(spec.key)
    if not pids:
        if daemons.answers(spec):
            return (
                "it answers on its pipe but no process of it is seen in /proc (another PID "
                "namespace): its /dev/shm is unknown"
            )
        own = daemons.shm_dir(spec.key) if daemons.shared_shm else None
        daemons.put_record(spec, None, (), own)  # dead: started again as its claims want it
        return None
    seen = {tuple(sorted(proc_environ(p, (DEVICE, ENV_SHM)).items())) for p in pids}
    if len(seen) != 1:
        return f"its processes {pids} show different devices or /dev/shm directories"
    env = dict(seen.pop())
    uuid = env.get(DEVICE)
    if not uuid:
        return f"its processes {pids} show no {DEVICE}"
    shm = Path(env[ENV_SHM]) if env.get(ENV_SHM) else None
    if shm is not None and shm.resolve() != daemons.shm_dir(spec.key).resolve():
        return f"its /dev/shm is {shm}, not {daemons.shm_dir(spec.key)}"
    # The device it sees, which a MIG device made again since may no longer be: the next
    # prepare (ensure) then restarts it on the new one.
    daemons.put_record(dataclasses.replace(spec, uuid=uuid), None, pids, shm)
    return None
