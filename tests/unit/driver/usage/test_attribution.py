"""Attribution: cgroup parsing, the device split and integration over time."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from driver.nvml.facade import Nvml
from driver.nvml.sim import SimControl, create_state, open_simulated
from driver.nvml.types import DeviceUsage, MigInstance, ProcessUsage
from driver.pod_cgroup import PodContainer, parse_cgroup
from driver.usage.attribution import (
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


def test_time_slices_are_allocated_one_over_n_and_partial_intervals_count() -> None:
    a = claim("a", {POD_A}, HeldDevice.time_sliced(GPU, "g"), at=0.0)
    b = claim("b", {POD_B}, HeldDevice.time_sliced(GPU, "g"), at=30.0)
    gone = ClaimAllocation(
        "c", "ns", "c", "t", frozenset(), (HeldDevice.whole(GPU, "g"),), 0.0, 5.0
    )
    usage = DeviceUsage(GPU, 0.0, 0, 80 * GIB, ())
    interval = integrate(0.0, 60.0, [a, b, gone], {GPU: usage})
    got = {c.claim_uid: c.allocated_s for c in interval.claims}
    # N at each moment: a shares with c for 5 s, is alone for 25 s, shares with b for 30 s;
    # the whole GPU is 1.
    assert got == {"a": pytest.approx(42.5), "b": pytest.approx(15.0), "c": pytest.approx(5.0)}


@pytest.mark.parametrize(
    "share",
    [HeldDevice.time_sliced(GPU, "gpu-1-ts-blue"), HeldDevice.mig(MIG, "gpu-1-mig-3g40gb-0", 3,
                                                                  share=None)],
    ids=["time-slice", "mig-share"],
)  # fmt: skip
def test_share_claims_that_follow_each_other_in_one_sample_are_each_billed_their_time(
    share: HeldDevice,
) -> None:
    """Two share claims one after the other on a device within one sample interval never
    shared it: each is allocated all of its own held time, the device held for both."""
    first = ClaimAllocation("a", "ns", "a", "t", frozenset({POD_A}), (share,), 0.0, 1020.0)
    second = ClaimAllocation("b", "ns", "b", "t", frozenset({POD_B}), (share,), 1030.0)
    records = [first]
    now = [1000.0]
    sink = RecordingSink()
    sampler = UsageSampler(_Idle(), lambda: records, sink, clock=lambda: now[0])
    sampler.sample_once()
    records.append(second)
    now[0] = 1060.0
    interval = sampler.sample_once()
    assert interval is not None
    got = {c.claim_uid: c.allocated_s for c in interval.claims}
    assert got == {"a": pytest.approx(20.0 * share.size), "b": pytest.approx(30.0 * share.size)}
    (device,) = interval.devices
    assert device.held_s == pytest.approx(50.0 * share.size)
    assert device.idle_s == pytest.approx(50.0 * share.size)


class _Idle:
    """A usage source whose every device is idle, with no process."""

    def device_usage(self, uuid: str) -> DeviceUsage:
        return DeviceUsage(uuid, 0.0, 0, 80 * GIB, ())


def test_two_shares_of_one_device_in_one_claim_are_billed_as_two_of_n_once_measured() -> None:
    """A claim allocated the same share device twice (two requests, or a count of two):
    two of the device's N holdings, and its processes' reading counted once."""
    share = HeldDevice.time_sliced(GPU, "gpu-1-ts-blue")
    a = claim("a", {POD_A}, share, share)
    b = claim("b", {POD_B}, share)
    usage = DeviceUsage(
        GPU, 100.0, 10 * GIB, 80 * GIB,
        (proc(1, GPU, POD_A, 60.0, 6 * GIB), proc(2, GPU, POD_B, 40.0, 4 * GIB)),
    )  # fmt: skip
    alone = integrate(0.0, 60.0, [a], {GPU: usage})
    assert [c.allocated_s for c in alone.claims] == [pytest.approx(60.0)]
    both = integrate(0.0, 60.0, [a, b], {GPU: usage})
    got = {c.claim_uid: (c.allocated_s, c.measured_s, c.memory_byte_s) for c in both.claims}
    assert got["a"] == pytest.approx((40.0, 36.0, 60.0 * 6 * GIB))
    assert got["b"] == pytest.approx((20.0, 24.0, 60.0 * 4 * GIB))
    (device,) = both.devices
    assert sum(c.measured_s for c in both.claims) + device.idle_s + device.unattributed_s == (
        pytest.approx(device.held_s)
    )


@pytest.fixture
def sim() -> Sim:
    store = create_state("dgx-h100")
    return Sim(open_simulated(store), SimControl(store))


@dataclass
class Sim:
    nvml: Nvml
    control: SimControl

    def gpu(self, index: int) -> str:
        return self.nvml.list_gpus()[index].uuid

    def mig(self, index: int, profile: str) -> MigInstance:
        parent = self.gpu(index)
        self.nvml.set_mig_mode(parent, True)
        p = next(p for p in self.nvml.gpu(parent).mig_profiles if p.name == profile)
        return self.nvml.create_mig_instance(parent, p.id, p.placements[0][0])


@pytest.mark.parametrize("device_util", [None, 82, 78])
def test_two_pods_on_a_simulated_mps_gpu(sim: Sim, device_util: int | None) -> None:
    gpu = sim.gpu(0)
    sim.control.add_process(
        gpu, 100, used_memory_bytes=4 * GIB, sm_util=30, cgroup=cgroup_v2(POD_A)
    )
    sim.control.add_process(
        gpu, 200, used_memory_bytes=8 * GIB, sm_util=50, cgroup=cgroup_v1(POD_B)
    )
    sim.control.set_utilization(gpu, gpu_percent=device_util)  # None: the processes' sum
    a = claim("a", {POD_A}, HeldDevice.mps(gpu, "g", 50))
    b = claim("b", {POD_B}, HeldDevice.mps(gpu, "g", 50))
    shared = claim("s", {POD_A, POD_B}, HeldDevice.whole(gpu, "g"))

    usage = sim.nvml.device_usage(gpu)
    two_claims = split_device(usage, [a, b])
    assert two_claims.busy["a"] == pytest.approx(0.30, abs=TOLERANCE)
    assert two_claims.busy["b"] == pytest.approx(0.50, abs=TOLERANCE)
    total = math.fsum([*two_claims.busy.values(), two_claims.unattributed, two_claims.idle])
    assert total == pytest.approx(1.0)
    assert two_claims.idle == pytest.approx(1 - usage.gpu_util_percent / 100)

    # One claim shared by both pods: the claim gets the sum, each pod its own part.
    one_claim = split_device(usage, [shared])
    assert one_claim.busy["s"] == pytest.approx(usage.gpu_util_percent / 100)
    assert one_claim.pod_busy[POD_A] == pytest.approx(0.30, abs=TOLERANCE)
    assert one_claim.pod_busy[POD_B] == pytest.approx(0.50, abs=TOLERANCE)
    assert one_claim.memory_bytes == {"s": 12 * GIB}


class RecordingSink:
    def __init__(self) -> None:
        self.intervals: list[IntervalUsage] = []
        self.errors: list[str] = []

    def add_usage(self, usage: IntervalUsage) -> None:
        self.intervals.append(usage)

    def count_error(self, reason: str) -> None:
        self.errors.append(reason)


def test_whole_gpu_and_mig_slice_each_go_to_their_sole_claim(sim: Sim) -> None:
    gpu = sim.gpu(0)
    mig = sim.mig(1, "3g.40gb")
    sim.control.add_process(gpu, 10, used_memory_bytes=9 * GIB, sm_util=65, cgroup=cgroup_v2(POD_A))
    sim.control.add_process(mig.uuid, 20, used_memory_bytes=3 * GIB, cgroup=cgroup_v2(POD_B))
    records = [
        claim("whole", {POD_A}, HeldDevice.whole(gpu, "gpu-0")),
        claim("slice", {POD_B}, HeldDevice.mig(mig.uuid, "gpu-1-mig-3g40gb-0", slices=3)),
    ]
    now = [1000.0]
    sink = RecordingSink()
    sampler = UsageSampler(sim.nvml, lambda: records, sink, clock=lambda: now[0])
    assert sampler.sample_once() is None  # a restarted plugin never re-bills the past
    now[0] = 1060.0
    interval = sampler.sample_once()
    assert interval is not None
    got = {c.claim_uid: c for c in interval.claims}
    assert got["whole"].allocated_s == pytest.approx(60.0)
    assert got["whole"].measured_s == pytest.approx(60.0 * 0.65)
    assert got["whole"].memory_byte_s == pytest.approx(60.0 * 9 * GIB)
    # MIG: 3 of 7 compute slices; NVML has no MIG utilisation, so busy means occupied.
    # Both in whole-GPU units: an occupied 3g slice is 3/7 of a GPU busy.
    assert got["slice"].allocated_s == pytest.approx(60.0 * 3 / 7)
    assert got["slice"].measured_s == pytest.approx(60.0 * 3 / 7)
    assert got["slice"].memory_byte_s == pytest.approx(60.0 * 3 * GIB)
    devices = {d.uuid: d for d in interval.devices}
    assert devices[gpu].idle_s == pytest.approx(60.0 * 0.35)
    assert devices[mig.uuid].idle_s == 0.0

    sim.control.remove_process(20)
    now[0] = 1120.0
    later = sampler.sample_once()
    assert later is not None
    assert {c.claim_uid: c.measured_s for c in later.claims}["slice"] == 0.0
    assert {d.uuid: d.idle_s for d in later.devices}[mig.uuid] == pytest.approx(60.0 * 3 / 7)


def test_sampler_survives_a_lost_gpu(sim: Sim) -> None:
    gpu = sim.gpu(0)
    records = [claim("a", {POD_A}, HeldDevice.whole(gpu, "g"))]
    now = [0.0]
    sink = RecordingSink()
    sampler = UsageSampler(sim.nvml, lambda: records, sink, clock=lambda: now[0])
    sampler.sample_once()
    sim.control.lose_gpu(gpu)
    now[0] = 10.0
    interval = sampler.sample_once()
    assert interval is not None
    (inc,) = interval.claims
    assert (inc.allocated_s, inc.measured_s, inc.unmeasured_s) == (10.0, 0.0, 10.0)
    assert sink.errors == ["nvml"]
    # The checkpoint says the claim held the GPU: held, neither idle nor unattributed.
    (device,) = interval.devices
    assert (device.uuid, device.held_s, device.idle_s, device.unattributed_s) == (
        gpu,
        10.0,
        0.0,
        0.0,
    )
    assert math.isnan(device.idle_ratio)
    # All of it unmeasured: the idle share (the recording rule's) is of the measured rest.
    assert device.unmeasured_s == 10.0


def test_unmeasured_time_is_each_claims_allocated_part_of_the_unreadable_device() -> None:
    a = claim("a", {POD_A}, HeldDevice.mps(GPU, "g", 50))
    b = claim("b", {POD_B}, HeldDevice.mps(GPU, "g", 30), HeldDevice.mig(MIG, "m", 3))
    usages = {MIG: DeviceUsage(MIG, 0.0, 0, 40 * GIB, ())}  # the GPU could not be read
    interval = integrate(0.0, 60.0, [a, b], usages)
    got = {c.claim_uid: (c.allocated_s, c.unmeasured_s) for c in interval.claims}
    assert got == {"a": (30.0, 30.0), "b": (pytest.approx(18.0 + 60 * 3 / 7), 18.0)}
    assert {d.uuid: d.held_s for d in interval.devices} == {
        GPU: 60.0,
        MIG: pytest.approx(60 * 3 / 7),
    }


def test_a_claim_prepared_again_counts_both_records_once_each() -> None:
    first = ClaimAllocation(
        "a", "ns", "c", "t", frozenset(), (HeldDevice.whole(GPU, "g"),), 0.0, 20.0
    )
    again = ClaimAllocation("a", "ns", "c", "t", frozenset(), (HeldDevice.whole(GPU, "g"),), 40.0)
    interval = integrate(0.0, 60.0, [first, again], {GPU: DeviceUsage(GPU, 0.0, 0, GIB, ())})
    assert sum(c.allocated_s for c in interval.claims) == pytest.approx(40.0)
