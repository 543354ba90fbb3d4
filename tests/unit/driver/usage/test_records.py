"""Attribution from the checkpoint's allocation records, across a plugin restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from driver.checkpoint.store import (
    AllocatedDeviceRecord,
    AllocationRecord,
    Checkpoint,
    CheckpointData,
    ClaimRecord,
    PodRecord,
)
from driver.metrics import Metrics
from driver.nvml.sim import SimControl, create_state, open_simulated
from driver.prepare.plan import Plan
from driver.usage.attribution import IntervalUsage, UsageSampler
from driver.usage.records import checkpoint_records, held_device

POD = "3f1e2c9a-1b2c-4d5e-8f90-123456789abc"
GIB = 1 << 30


def device(name: str, uuid: str, share_id: str | None = None) -> AllocatedDeviceRecord:
    return AllocatedDeviceRecord(name=name, uuid=uuid, gpu_uuid=uuid, mode="MPS", share_id=share_id)


@pytest.mark.parametrize(
    ("name", "share_id", "fraction_of_two"),
    [
        ("gpu-76091111", None, 1.0),  # MPS between the claim's own pods: the GPU is the claim's
        ("gpu-76091111-mig-3g40gb-4", None, 3 / 7),
        ("gpu-76091111-mig-1g10gbme-6", None, 1 / 7),
        ("gpu-76091111", "share-1", 1 / 2),
        # A sharing group an administrator named like a MIG profile is no MIG slice: the
        # claims time-slicing the GPU are each billed the whole GPU, not 1/7 of it.
        ("gpu-76091111-ts-mig-1gpu", None, 1.0),
        ("gpu-76091111-mps-team-mig-2g", "share-1", 1 / 2),
        ("gpu-7609111122223333-mig-2g20gb-0", None, 2 / 7),  # a GPU with a 16-digit name
    ],
)
def test_allocated_share_from_record(
    name: str, share_id: str | None, fraction_of_two: float
) -> None:
    assert held_device(device(name, "GPU-x", share_id)).fraction(2) == pytest.approx(
        fraction_of_two
    )


def record(
    uid: str, uuid: str, prepared_at: float, unprepared_at: float | None = None
) -> AllocationRecord:
    return AllocationRecord(
        claim_uid=uid,
        namespace="ml",
        claim=f"claim-{uid}",
        pods=(PodRecord(name="trainer", uid=POD),),
        devices=(device("gpu-0", uuid),),
        prepared_at=prepared_at,
        unprepared_at=unprepared_at,
    )


def test_restarted_plugin_keeps_attributing_from_the_checkpoint(tmp_path: Path) -> None:
    store = create_state("dgx-h100")
    nvml = open_simulated(store)
    control = SimControl(store)
    gpus = [g.uuid for g in nvml.list_gpus()]
    control.add_process(
        gpus[0], 10, used_memory_bytes=GIB, sm_util=40, cgroup=f"0::/kubepods/pod{POD}/{'c' * 64}"
    )
    control.set_utilization(gpus[0], gpu_percent=40)
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path, boot_id="boot-1")
    active = record("a", gpus[0], prepared_at=0.0)
    checkpoint.save(
        CheckpointData(
            claims={
                "a": ClaimRecord(
                    uid="a",
                    namespace="ml",
                    name="claim-a",
                    state="PrepareCompleted",
                    plan=Plan(claim_uid="a", devices=(), steps=()),
                    started_at=0.0,
                    completed_at=0.0,
                    allocation=active,
                )
            },
            # Unprepared while the plugin was down: still in the history.
            history=[record("b", gpus[1], prepared_at=0.0, unprepared_at=130.0)],
        )
    )
    tenants = {"ml": "blue"}
    provider = checkpoint_records(path, tenant_of=lambda ns: tenants[ns])

    now = [0.0]
    first = UsageSampler(nvml, provider, Metrics(CollectorRegistry()), clock=lambda: now[0])
    first.sample_once()
    now[0] = 60.0
    before = first.sample_once()
    assert before is not None
    assert {c.claim_uid: c.allocated_s for c in before.claims} == {"a": 60.0, "b": 60.0}

    # The plugin restarts: a new process, new metrics, the same checkpoint file.
    now[0] = 100.0
    second = UsageSampler(nvml, provider, Metrics(CollectorRegistry()), clock=lambda: now[0])
    assert second.sample_once() is None
    now[0] = 160.0
    after = second.sample_once()
    assert isinstance(after, IntervalUsage)
    got = {c.claim_uid: c for c in after.claims}
    assert got["a"].allocated_s == 60.0
    assert got["a"].measured_s == pytest.approx(60.0 * 0.4)
    assert got["a"].tenant == "blue"
    assert got["b"].allocated_s == pytest.approx(30.0)  # up to its unprepare at 130


def test_the_plugin_s_checkpoint_is_sampled_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler of the plugin reads its own checkpoint's view: at each sample the
    claim files are not parsed again while no other process changed them, and a claim
    prepared or unprepared through that checkpoint shows at the next sample."""
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-1")
    provider = checkpoint_records(checkpoint)
    active = record("a", "GPU-1", prepared_at=0.0)
    checkpoint.put(
        ClaimRecord(
            uid="a",
            namespace="ml",
            name="claim-a",
            state="PrepareCompleted",
            plan=Plan(claim_uid="a", devices=(), steps=()),
            started_at=0.0,
            completed_at=0.0,
            allocation=active,
        )
    )
    checkpoint.load(locked=True)  # the executor's next lock: the view is current
    reads: list[Path] = []
    real_read = Path.read_bytes

    def counting_read(path: Path) -> bytes:
        if path.parent == checkpoint.directory and path.name.startswith("a"):
            reads.append(path)
        return real_read(path)

    monkeypatch.setattr(Path, "read_bytes", counting_read)
    assert [r.claim_uid for r in provider()] == ["a"]
    assert [r.claim_uid for r in provider()] == ["a"]
    assert reads == []

    checkpoint.remove("a", active.model_copy(update={"unprepared_at": 30.0}))
    ended = list(provider())
    assert [(r.claim_uid, r.unprepared_at) for r in ended] == [("a", 30.0)]
