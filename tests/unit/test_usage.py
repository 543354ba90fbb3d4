"""Attribution: cgroup parsing, the device split and integration over time."""

from __future__ import annotations

import math

import pytest

from driver.errors import NvmlError
from driver.nvml.types import DeviceUsage, ProcessUsage
from driver.pod_cgroup import PodContainer, parse_cgroup
from driver.usage import (
    ClaimAllocation,
    HeldDevice,
    IntervalUsage,
    UsageSampler,
    integrate,
    split_device,
)

POD_A = "3f1e2c9a-1b2c-4d5e-8f90-123456789abc"
POD_B = "7d2a0b11-aaaa-4bbb-8ccc-0123456789de"
CID = "a" * 64
GIB = 1 << 30
TOLERANCE = 0.02  # docs/metrics.md: two percentage points of the device


def cgroup_v2(pod: str, qos: str = "burstable") -> str:
    slug = pod.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice/"
        f"cri-containerd-{CID}.scope\n"
    )


def cgroup_v1(pod: str) -> str:
    return "".join(
        f"{i}:{ctrl}:/kubepods/burstable/pod{pod}/{CID}\n"
        for i, ctrl in ((12, "memory"), (4, "cpu,cpuacct"), (1, "name=systemd"))
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (cgroup_v2(POD_A), PodContainer(POD_A, CID)),
        (cgroup_v2(POD_A, "besteffort"), PodContainer(POD_A, CID)),
        (
            f"0::/kubepods.slice/kubepods-pod{POD_A.replace('-', '_')}.slice/crio-{CID}.scope",
            PodContainer(POD_A, CID),
        ),
        (cgroup_v1(POD_A), PodContainer(POD_A, CID)),
        (f"0::/kubepods/pod{POD_B}/{CID}", PodContainer(POD_B, CID)),
        (
            "0::/kubepods/burstable/pod" + "0123456789abcdef" * 2 + "/" + CID,
            PodContainer("0123456789abcdef" * 2, CID),
        ),
        (f"0::/kubepods/burstable/pod{POD_A}", PodContainer(POD_A, "")),
        (
            f"0::/kubepods.slice/kubepods-pod{POD_A.replace('-', '_')}.slice/"
            f"crio-conmon-{CID}.scope",
            PodContainer(POD_A, ""),
        ),
        (
            "0::/system.slice/docker-" + "b" * 64 + ".scope/kubelet.slice/kubelet-kubepods.slice/"
            f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod"
            f"{POD_B.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
            PodContainer(POD_B, CID),
        ),
        ("0::/system.slice/sshd.service\n", None),
        ("0::/user.slice/pod" + POD_A + "/x\n", None),
        ("", None),
        ("garbage without colons", None),
    ],
    ids=[
        "v2-systemd-burstable",
        "v2-systemd-besteffort",
        "v2-systemd-guaranteed-crio",
        "v1-cgroupfs-multiline",
        "cgroupfs-guaranteed",
        "static-pod-hash-uid",
        "pod-cgroup-itself",
        "crio-conmon",
        "nested-kind-node",
        "host-process",
        "pod-outside-kubepods",
        "empty",
        "garbage",
    ],
)
def test_parse_cgroup(text: str, expected: PodContainer | None) -> None:
    assert parse_cgroup(text) == expected


def test_nested_pod_named_cgroup_cannot_move_usage_to_another_pod() -> None:
    text = f"0::/kubepods/burstable/pod{POD_A}/{CID}/pod{POD_B}/evil"
    assert parse_cgroup(text) == PodContainer(POD_A, CID)


def proc(pid: int, uuid: str, pod: str | None, sm: float, mem: int) -> ProcessUsage:
    return ProcessUsage(
        pid=pid,
        device_uuid=uuid,
        used_memory_bytes=mem,
        sm_util_percent=sm,
        cgroup=cgroup_v2(pod) if pod else "0::/system.slice/nvidia-persistenced.service\n",
    )


def claim(uid: str, pods: set[str], *devices: HeldDevice, at: float = 0.0) -> ClaimAllocation:
    return ClaimAllocation(
        claim_uid=uid,
        namespace=f"ns-{uid}",
        name=f"claim-{uid}",
        tenant=f"tenant-{uid}",
        pod_uids=frozenset(pods),
        devices=devices,
        prepared_at=at,
    )


GPU = "GPU-11111111-2222-3333-4444-555555555555"
MIG = "MIG-99999999-8888-7777-6666-555555555555"


@pytest.mark.parametrize("device_util", [80.0, 82.0, 78.5])
def test_mps_split_follows_process_usage_and_sums_with_idle(device_util: float) -> None:
    a = claim("a", {POD_A}, HeldDevice.mps(GPU, "gpu-11111111", 50))
    b = claim("b", {POD_B}, HeldDevice.mps(GPU, "gpu-11111111", 50))
    usage = DeviceUsage(
        uuid=GPU,
        gpu_util_percent=device_util,
        memory_used_bytes=13 * GIB,
        memory_total_bytes=80 * GIB,
        processes=(
            proc(100, GPU, POD_A, 30.0, 4 * GIB),
            proc(200, GPU, POD_B, 50.0, 8 * GIB),
        ),
    )
    split = split_device(usage, [a, b])
    assert split.busy["a"] == pytest.approx(0.30, abs=TOLERANCE)
    assert split.busy["b"] == pytest.approx(0.50, abs=TOLERANCE)
    assert split.busy["b"] / split.busy["a"] == pytest.approx(50 / 30)
    assert split.idle == pytest.approx(1 - device_util / 100)
    assert math.fsum([*split.busy.values(), split.unattributed, split.idle]) == pytest.approx(1.0)
    assert split.memory_bytes == {"a": 4 * GIB, "b": 8 * GIB}
    assert split.unattributed_memory_bytes == 1 * GIB


def test_device_reading_is_never_copied_to_each_consumer() -> None:
    holders = [claim(str(i), {f"{i:08d}-0000-0000-0000-000000000000"}) for i in range(4)]
    usage = DeviceUsage(GPU, 100.0, 0, 80 * GIB, ())
    split = split_device(usage, holders)
    assert sum(split.busy.values()) + split.unattributed == pytest.approx(1.0)
    assert split.unattributed == pytest.approx(1.0)  # no process: nobody can be named


def test_process_outside_every_claim_is_unattributed() -> None:
    a = claim("a", {POD_A}, HeldDevice.time_sliced(GPU, "g"))
    b = claim("b", {POD_B}, HeldDevice.time_sliced(GPU, "g"))
    usage = DeviceUsage(
        GPU,
        60.0,
        6 * GIB,
        80 * GIB,
        (
            proc(1, GPU, POD_A, 20.0, GIB),
            proc(2, GPU, None, 20.0, GIB),
            proc(3, GPU, "00000000-0000-0000-0000-000000000001", 20.0, GIB),
        ),
    )
    split = split_device(usage, [a, b])
    assert split.busy == {"a": pytest.approx(0.2), "b": 0.0}
    assert split.unattributed == pytest.approx(0.4)
    assert split.idle == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("device", "uuid", "fraction"),
    [
        (HeldDevice.whole(GPU, "gpu-11111111"), GPU, 1.0),
        (HeldDevice.mig(MIG, "gpu-11111111-mig-3g40gb-4", slices=3), MIG, 3 / 7),
    ],
    ids=["whole-gpu", "mig-3g"],
)
def test_sole_claim_gets_its_device(device: HeldDevice, uuid: str, fraction: float) -> None:
    a = claim("a", {POD_A}, device, at=0.0)
    # MIG devices report no per-process utilisation; the whole GPU here has samples.
    sm = 0.0 if uuid == MIG else 65.0
    usage = DeviceUsage(uuid, 65.0, 10 * GIB, 40 * GIB, (proc(7, uuid, POD_A, sm, 9 * GIB),))
    interval = integrate(100.0, 160.0, [a], {uuid: usage})
    (inc,) = interval.claims
    assert inc.allocated_s == pytest.approx(60.0 * fraction)
    assert inc.measured_s == pytest.approx(60.0 * 0.65)
    assert inc.memory_byte_s == pytest.approx(60.0 * 9 * GIB)
    (dev,) = interval.devices
    assert dev.uuid == uuid
    assert dev.idle_s + dev.unattributed_s + inc.measured_s == pytest.approx(dev.held_s)


def test_time_slices_are_allocated_one_over_n_and_partial_intervals_count() -> None:
    a = claim("a", {POD_A}, HeldDevice.time_sliced(GPU, "g"), at=0.0)
    b = claim("b", {POD_B}, HeldDevice.time_sliced(GPU, "g"), at=30.0)
    gone = ClaimAllocation(
        "c", "ns", "c", "t", frozenset(), (HeldDevice.whole(GPU, "g"),), 0.0, 5.0
    )
    usage = DeviceUsage(GPU, 0.0, 0, 80 * GIB, ())
    interval = integrate(0.0, 60.0, [a, b, gone], {GPU: usage})
    got = {c.claim_uid: c.allocated_s for c in interval.claims}
    # Three holders during the interval: the time-slices are 1/3 each, the whole GPU is 1.
    assert got == {"a": pytest.approx(20.0), "b": pytest.approx(10.0), "c": pytest.approx(5.0)}


class FakeNvml:
    def __init__(self) -> None:
        self.readings: dict[str, DeviceUsage] = {}
        self.broken: set[str] = set()

    def device_usage(self, uuid: str) -> DeviceUsage:
        if uuid in self.broken:
            raise NvmlError(f"nvmlDeviceGetUtilizationRates({uuid}) failed: GPU is lost", 15)
        return self.readings[uuid]


class RecordingSink:
    def __init__(self) -> None:
        self.intervals: list[IntervalUsage] = []
        self.errors: list[str] = []

    def add_usage(self, usage: IntervalUsage) -> None:
        self.intervals.append(usage)

    def count_error(self, reason: str) -> None:
        self.errors.append(reason)


def test_sampler_starts_counting_at_its_first_sample_and_survives_nvml_errors() -> None:
    now = [1000.0]
    nvml = FakeNvml()
    nvml.readings[GPU] = DeviceUsage(GPU, 50.0, 0, 80 * GIB, (proc(1, GPU, POD_A, 50.0, 0),))
    records = [claim("a", {POD_A}, HeldDevice.whole(GPU, "g"), at=0.0)]
    sink = RecordingSink()
    sampler = UsageSampler(nvml, lambda: records, sink, clock=lambda: now[0])

    assert sampler.sample_once() is None  # a restarted plugin never re-bills the past
    now[0] = 1010.0
    first = sampler.sample_once()
    assert first is not None
    assert first.claims[0].measured_s == pytest.approx(5.0)

    nvml.broken.add(GPU)
    now[0] = 1020.0
    second = sampler.sample_once()
    assert second is not None
    (inc,) = second.claims
    assert (inc.allocated_s, inc.measured_s, inc.unmeasured_s) == (10.0, 0.0, 10.0)
    assert sink.errors == ["nvml"]
    assert len(sink.intervals) == 2
