"""A dynamic MIG device's last interval: read before its unprepare destroys it, never
unmeasured (``UsageSampler.read_final``)."""

from __future__ import annotations

import dataclasses

import pytest

from driver.nvml.sim import SimControl, create_state, open_simulated
from driver.nvml.types import MigInstance
from driver.usage.attribution import ClaimAllocation, HeldDevice, IntervalUsage, UsageSampler

POD = "3f1e2c9a-1b2c-4d5e-8f90-123456789abc"
CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    f"{POD.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope\n"
)
GIB = 1 << 30
SIZE = 3 / 7  # a 3g.40gb device in whole GPUs


class Sink:
    def __init__(self) -> None:
        self.intervals: list[IntervalUsage] = []
        self.errors: list[str] = []

    def add_usage(self, usage: IntervalUsage) -> None:
        self.intervals.append(usage)

    def count_error(self, reason: str) -> None:
        self.errors.append(reason)


class Node:
    """A simulated H100 with one dynamic MIG device, held by one claim from t=1000."""

    def __init__(self) -> None:
        store = create_state("dgx-h100")
        self.nvml = open_simulated(store)
        self.control = SimControl(store)
        self.parent = self.nvml.list_gpus()[0].uuid
        self.nvml.set_mig_mode(self.parent, True)
        profile = next(p for p in self.nvml.gpu(self.parent).mig_profiles if p.name == "3g.40gb")
        self.mig: MigInstance = self.nvml.create_mig_instance(
            self.parent, profile.id, profile.placements[0][0]
        )
        self.record = ClaimAllocation(
            claim_uid="c1",
            namespace="ml",
            name="train",
            tenant="blue",
            pod_uids=frozenset({POD}),
            devices=(HeldDevice.mig(self.mig.uuid, "gpu-0-mig-3g40gb-0", 3),),
            prepared_at=1000.0,
        )
        self.now = 1000.0
        self.sink = Sink()
        self.sampler = UsageSampler(
            self.nvml, lambda: [self.record], self.sink, clock=lambda: self.now
        )

    def unprepare(self, at: float, *, recorded: bool = True) -> None:
        """What the executor does: the last reading, the destroy, then ``unprepared_at``."""
        self.now = at
        self.sampler.read_final([self.mig.uuid])
        self.control.remove_process(20)  # the sim refuses to destroy a device in use
        assert self.nvml.destroy_mig_instance(self.parent, self.mig.gi_id)
        if recorded:
            self.record = dataclasses.replace(self.record, unprepared_at=at)

    def sample(self, at: float) -> IntervalUsage:
        self.now = at
        interval = self.sampler.sample_once()
        assert interval is not None
        return interval


@pytest.fixture
def node() -> Node:
    node = Node()
    node.control.add_process(node.mig.uuid, 20, used_memory_bytes=3 * GIB, cgroup=CGROUP)
    assert node.sampler.sample_once() is None  # the starting point, t=1000
    return node


def test_a_dynamic_mig_device_unprepared_mid_interval_is_measured_up_to_its_unprepare(
    node: Node,
) -> None:
    node.unprepare(at=1030.0)  # busy until then: a process of the claim's pod runs on it
    interval = node.sample(at=1060.0)
    (inc,) = interval.claims
    assert (inc.allocated_s, inc.measured_s, inc.unmeasured_s) == pytest.approx(
        (30 * SIZE, 30 * SIZE, 0.0)
    ), "the held half of the interval is measured from the reading taken before the destroy"
    assert inc.memory_byte_s == pytest.approx(30 * 3 * GIB)
    (device,) = interval.devices
    assert (device.held_s, device.idle_s, device.unmeasured_s) == pytest.approx(
        (30 * SIZE, 0.0, 0.0)
    )
    assert node.sink.errors == []  # a destroyed device is no NVML error
    assert node.sample(at=1090.0).claims == ()  # ended: nothing after its unprepare


def test_a_sample_between_the_destroy_and_the_record_uses_the_last_reading(node: Node) -> None:
    node.unprepare(at=1030.0, recorded=False)  # the sample runs before unpreparedAt is written
    first = node.sample(at=1031.0)
    node.record = dataclasses.replace(node.record, unprepared_at=1032.0)
    second = node.sample(at=1060.0)
    got = [x for c in (*first.claims, *second.claims) for x in (c.measured_s, c.unmeasured_s)]
    assert got == pytest.approx([31 * SIZE, 0.0, 1 * SIZE, 0.0])
    assert node.sink.errors == []


def test_a_device_whose_unprepare_failed_is_read_again(node: Node) -> None:
    """The last reading is only for a device its claim no longer holds: one whose destroy
    failed is still there, and still the claim's, so later samples read it as it is."""
    node.now = 1030.0
    node.sampler.read_final([node.mig.uuid])  # then the destroy fails: no unpreparedAt
    node.control.remove_process(20)
    interval = node.sample(at=1060.0)
    (inc,) = interval.claims
    assert (inc.allocated_s, inc.measured_s, inc.unmeasured_s) == pytest.approx(
        (60 * SIZE, 0.0, 0.0)
    )


def test_a_lost_device_is_still_unmeasured(node: Node) -> None:
    node.control.lose_gpu(node.parent)
    node.now = 1030.0
    node.sampler.read_final([node.mig.uuid])
    node.record = dataclasses.replace(node.record, unprepared_at=1030.0)
    interval = node.sample(at=1060.0)
    (inc,) = interval.claims
    assert (inc.allocated_s, inc.measured_s, inc.unmeasured_s) == pytest.approx(
        (30 * SIZE, 0.0, 30 * SIZE)
    )
    assert node.sink.errors == ["nvml"]  # once, by the last reading; the sample reads no more


class _UnprepareDuringRead:
    """NVML as the sampler sees it while an unprepare runs on another thread: the claim's
    unprepare (last reading, destroy) lands after the sample took its time and its records,
    just before the sample reads the device."""

    def __init__(self, node: Node, at: float) -> None:
        self._node, self._at, self._done = node, at, False

    def device_usage(self, uuid: str) -> object:
        if uuid == self._node.mig.uuid and not self._done:
            self._done = True
            sample_time = self._node.now
            self._node.unprepare(at=self._at)
            self._node.now = sample_time
        return self._node.nvml.device_usage(uuid)


def test_an_unprepare_during_a_sample_leaves_no_unmeasured_time(node: Node) -> None:
    """The device was there for the whole interval the sample closes; the unprepare that
    destroyed it while the sample was reading gave its last reading, which stands for it,
    not an NVML error and unmeasured time."""
    node.sampler._nvml = _UnprepareDuringRead(node, at=1060.5)  # type: ignore[assignment]
    interval = node.sample(at=1060.0)
    (inc,) = interval.claims
    assert (inc.allocated_s, inc.measured_s, inc.unmeasured_s) == pytest.approx(
        (60 * SIZE, 60 * SIZE, 0.0)
    ), "the interval before the unprepare reads as unmeasured"
    assert node.sink.errors == []
    (last,) = node.sample(at=1090.0).claims  # its held half second after the sample
    assert (last.allocated_s, last.unmeasured_s) == pytest.approx((0.5 * SIZE, 0.0))
