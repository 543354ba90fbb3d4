"""The object graph of one node's plugin: wired completely before any socket opens.

:class:`NodePlugin` owns the NVML session, the inventory, the executor
(:class:`~driver.prepare.executor.DeviceState`), the ResourceSlice publisher, the health
monitor and its watcher, the namespace label cache, the usage sampler and the gRPC
servers. ``start()`` recovers the checkpoint, builds the slices, opens the DRA socket and
only after it the registration socket (the kubelet connects as soon as the latter
appears), then writes the slices. ``stop()`` undoes it in reverse order.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from driver.checkpoint import holds
from driver.checkpoint.records import ClaimRecord
from driver.checkpoint.store import Checkpoint, CheckpointData
from driver.devices.bridge import check_no_device_plugin
from driver.devices.inventory import build_inventory
from driver.devices.slice_fit import left_out_groups
from driver.devices.slices import MAX_TAINTS, build_slices
from driver.errors import ApiUnavailable, error_reason
from driver.faults import FaultPoints
from driver.health.metrics import HealthMetrics
from driver.health.monitor import HealthChange, HealthMonitor, device_gpu_map, mig_slot_map
from driver.health.store import HealthStateFile
from driver.health.watch import HealthWatcher
from driver.kube.features import LOSSES, ServerFeatures, discover
from driver.kube.http import KubeClient
from driver.metrics import Metrics
from driver.nvml.driver_root import DriverRoot
from driver.nvml.facade import Nvml
from driver.nvml.types import GpuInfo
from driver.prepare.cdi import CdiSpecs, DeviceNumbers
from driver.prepare.driver_root import DriverFiles, find_driver_files
from driver.prepare.executor import DeviceState
from driver.prepare.recovery import RecoveryReport
from driver.prepare.unprepare_path import created_mig_uuids
from driver.sharing import SharingConfig, SharingNode
from driver.sharing import managed_mig_uuids as sharing_mig_uuids
from driver.usage.attribution import UsageSampler
from driver.usage.records import checkpoint_records
from kubelet_plugin.bridge_check import DevicePluginWatch, check_node, check_node_when_reachable
from kubelet_plugin.claim_status import ClaimStatusWriter, StatusWritingDriver
from kubelet_plugin.dra_driver import ApiClaimReader, PluginDriver
from kubelet_plugin.event_recorder import EventRecorder, EventType, ObjectRef
from kubelet_plugin.grpc_server import DRAIN_S, PluginServer
from kubelet_plugin.health_events import HealthEvents
from kubelet_plugin.left_out_shares import LeftOutShares
from kubelet_plugin.measured_driver import MeasuredDriver
from kubelet_plugin.memory import release_freed_memory, settle_after_start
from kubelet_plugin.namespace_cache import WatchedNamespaces
from kubelet_plugin.pod_groups import NOT_SERVED as POD_GROUPS_NOT_SERVED
from kubelet_plugin.pod_groups import PodGroupResolver, join_pod
from kubelet_plugin.publisher import Publisher
from kubelet_plugin.runtime_errors import RuntimeErrorWatcher
from kubelet_plugin.settings import PluginSettings
from kubelet_plugin.sweeper import Sweeper

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
SIM_DRIVER_ROOT = "sim-driver-root"
LOCK_FILE = "plugin.lock"
HEALTH_FILE = "health.json"
# Ended claims' records stay in memory this long (at least three usage samples), enough for
# attribution to count their last partial interval; older ones live only in the history file.
HISTORY_MEMORY_S = 600.0


def managed_mig_uuids(state: CheckpointData) -> set[str]:
    """MIG instances the driver created for claims: their slots stay dynamic slots."""
    return {uuid for record in state.claims.values() for uuid in created_mig_uuids(record)}


def _device_numbers(settings: PluginSettings) -> DeviceNumbers | None:
    """Device node numbers for CDI specs on a simulated node; a real node names host paths."""
    if settings.nvml != "simulated":
        return None
    from driver.nvml.sim import PROC_DEVICES  # noqa: PLC0415 (no simulation on a real node)

    return DeviceNumbers.from_proc_devices(PROC_DEVICES)


def driver_files(
    settings: PluginSettings, nvml: Nvml, gpus: Sequence[GpuInfo] | None = None
) -> DriverFiles:
    """The driver's files for every claim's CDI spec, found once at start.

    With ``--nvml simulated`` the simulated driver root is written first: at
    ``--driver-root``, or ``<state dir>/sim-driver-root`` when that is ``/``.
    """
    root = settings.driver_root
    if settings.nvml == "simulated":
        from driver.nvml.sim import write_driver_root  # noqa: PLC0415 (a real node never loads it)

        if root == Path("/"):
            root = settings.data_dir / SIM_DRIVER_ROOT
        write_driver_root(root, nvml.system_info(), nvml.list_gpus() if gpus is None else gpus)
    host_root = str(settings.host_driver_root or root)
    files = find_driver_files(root, host_root, hook_path=settings.cdi_hook_path)
    if files.missing:
        log.error(
            "driver root lacks libraries CUDA containers need driver_root=%s missing=%s",
            root,
            ",".join(files.missing),
            extra={"node": settings.node_name},
        )
    return files


def sharing_config(settings: PluginSettings, files: DriverFiles) -> SharingConfig:
    """The sharing settings with the MPS control binary by path: a bare name (the default
    ``nvidia-cuda-mps-control``) is the driver root's, never one on ``PATH`` (a plugin
    container has no driver there); a path is the operator's choice."""
    config = settings.sharing
    if "/" in config.mps_control:
        return config
    binary = DriverRoot(files.root).binary(config.mps_control)
    return config.model_copy(update={"mps_control": binary})


class NodePlugin:
    """Everything the kubelet plugin runs on one node."""

    def __init__(
        self,
        settings: PluginSettings,
        kube: KubeClient,
        nvml: Nvml,
        registry: CollectorRegistry,
        metrics: Metrics,
        *,
        faults: FaultPoints | None = None,
    ) -> None:
        self.settings = settings
        self.nvml = nvml
        self.metrics = metrics
        data_dir = settings.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        settings.cdi_root.mkdir(parents=True, exist_ok=True)
        faults = faults or FaultPoints.from_env(os.environ)

        self.checkpoint = Checkpoint(
            data_dir / CHECKPOINT_FILE,
            faults=faults,
            history_memory_s=max(HISTORY_MEMORY_S, 3 * settings.sample_interval_s),
        )
        state, _ = self.checkpoint.load()
        self.sampler = UsageSampler(nvml, checkpoint_records(self.checkpoint), self.metrics)
        gpus = nvml.list_gpus()  # once: a discovery is hundreds of NVML calls per GPU
        self.inventory = build_inventory(
            gpus,
            nvml.system_info(),
            settings.advertise,
            managed_mig_uuids=managed_mig_uuids(state) | sharing_mig_uuids(nvml, data_dir),
            mig_profiles=settings.mig_profiles,
        )
        for note in self.inventory.notes:
            log.info("inventory note=%s", note, extra={"node": settings.node_name})
        self.driver_files = driver_files(settings, nvml, gpus)
        self.sharing = SharingNode(
            nvml,
            self.inventory,
            sharing_config(settings, self.driver_files),
            state_dir=data_dir,
            faults=faults,
            simulated=settings.nvml == "simulated",
            boot_id=self.checkpoint.boot_id,
        )
        self.state = DeviceState(
            nvml,
            self.inventory,
            CdiSpecs(
                settings.cdi_root,
                faults=faults,
                numbers=_device_numbers(settings),
                node_edits=self.driver_files.edits(),
            ),
            self.checkpoint,
            lock_path=data_dir / LOCK_FILE,
            driver_name=settings.driver_name,
            node_name=settings.node_name,
            handlers=self.sharing.handlers,
            guards=self.sharing.guards,
            shares=self.sharing.shares,
            faults=faults,
            dedicated_to=settings.dedicated_to,
            on_holds_changed=self.republish,
            before_destroy=self.sampler.read_final,
        )
        self.health = HealthMonitor(
            settings.health_policy,
            settings.node_name,
            store=HealthStateFile(data_dir / HEALTH_FILE),
            metrics=HealthMetrics(registry),
        )
        self.health.set_devices(device_gpu_map(self.inventory), mig_slot_map(self.inventory))
        self.health.add_listener(self._on_health_change)
        # what an unprepare could not undo on a lost GPU goes once the GPU answers
        self.sweeper = Sweeper(self.state.sweep, self.state.left_over, settings.sweep_interval_s)
        self.health.add_listener(self.sweeper)
        self.watcher = HealthWatcher(
            self.health,
            nvml.wait_event,
            nvml.probe,
            recovery_action=nvml.recovery_action,
            # Only GPUs with a published device: an event of a GPU the monitor does not know
            # (one hidden by --advertise) would count as unattributed and taint every GPU.
            register_events=lambda: nvml.register_events(self.health.gpus()),
        )
        self.publisher = Publisher(
            kube,
            settings.driver_name,
            settings.node_name,
            on_count=self._on_publish,
            on_reconnect=self._on_reconnect,
        )
        self.features: ServerFeatures | None = None
        self._missing_api: str | None = None
        self._kube = kube
        self.events = EventRecorder(
            kube, settings.node_name, on_error=lambda: metrics.count_error("event")
        )
        self._health_events = HealthEvents(self.events)
        self.namespaces = WatchedNamespaces(kube)
        self.device_plugins = (
            DevicePluginWatch(kube, settings.node_name, events=self.events)
            if settings.device_plugin_check
            else None
        )
        self.runtime_errors = RuntimeErrorWatcher(
            kube,
            settings.node_name,
            self._claim_records,
            self.events,
            on_pod=lambda pod: join_pod(self.state, pod),
        )
        self.plugin_driver = PluginDriver(
            self.state,
            ApiClaimReader(kube),
            self.namespaces,
            default_level=settings.default_trust_level,
            events=self.events,
            metrics=metrics,
            refusal=self.device_plugins.refusal if self.device_plugins else None,
            pod_groups=PodGroupResolver(kube, settings.node_name, self._pod_group_version),
        )
        measured = MeasuredDriver(self.plugin_driver, metrics)
        self.driver: StatusWritingDriver | MeasuredDriver = (
            StatusWritingDriver(
                measured,
                ClaimStatusWriter(
                    kube,
                    settings.driver_name,
                    on_error=lambda _reason: metrics.count_error("claim-status"),
                ),
                lambda: self.checkpoint.load()[0],
            )
            if settings.claim_status
            else measured
        )
        self.server = PluginServer(
            settings.driver_name,
            settings.kubelet_root_dir,
            self.driver,
            health=self.health,
            rolling_update_uid=settings.rolling_update_uid,
            max_workers=settings.grpc_workers,
        )
        self._stop = threading.Event()
        self._sampler_thread = threading.Thread(
            target=self._sample_loop, name="usage-sampler", daemon=True
        )
        self._published_devices = 0
        self._unpublished_shares = 0
        self._left_out_shares = LeftOutShares(settings.node_name, self._node_event)
        self.recovery: RecoveryReport | None = None

    # ----- slices ---------------------------------------------------------------------------

    def desired_slices(self) -> list[dict[str, Any]]:
        extra = self.sharing.extra_devices(self.inventory)
        features = self.features
        if features is not None and not features.consumable_capacity:
            extra = {}  # share devices need consumable capacity (logged at discovery)
        devices = device_gpu_map(self.inventory)
        for gpu, shares in extra.items():
            uuid = self.inventory.gpu_of(gpu).uuid
            devices.update({str(share["name"]): uuid for share in shares})
        self.health.set_devices(devices, mig_slot_map(self.inventory))
        taints = {k: v for k, v in self.health.taints_by_device(devices).items() if v}
        held = holds.taint(self.checkpoint.holds())
        if held is not None:  # no new claim here while a corrupt claim file's devices are unknown
            for name in devices:
                taints[name] = [*taints.get(name, []), dict(held)]
        if features is not None and not features.device_taints:
            taints = {}  # the server would drop them (logged at discovery)
        elif features is not None and not features.taint_effect_none:
            # Kubernetes 1.34 refuses a slice with a `None` taint (informational: it changes
            # nothing for the scheduler or eviction; logs, events and metrics still tell)
            taints = {
                name: kept
                for name, ts in taints.items()
                if (kept := [t for t in ts if t["effect"] != "None"])
            }
        layout = features.slice_layout if features else "split"
        limit = features.max_slice_device_counters if features else None
        slices = build_slices(
            self.inventory,
            self.settings.node_name,
            self.settings.driver_name,
            taints=taints,
            extra_devices=extra,
            common_attributes=(
                {"dedicatedTo": {"string": self.settings.dedicated_to}}
                if self.settings.dedicated_to
                else None
            ),
            layout=layout,
            max_taints=features.max_device_taints if features else MAX_TAINTS,
            max_slice_counters=limit,
        )
        self._published_devices = sum(len(s["spec"].get("devices", [])) for s in slices)
        # Only the 1.34 layout leaves shares out for its limits (without counters, "none",
        # none is published at all, as discovery logged)
        left_out = left_out_groups(extra, slices) if layout == "combined" else {}
        self._unpublished_shares = self._left_out_shares.update(extra, left_out, limit)
        return slices

    def republish(self) -> None:
        self.publisher.update(self.desired_slices())
        self.metrics.set_published_devices(self._published_devices)
        self.metrics.set_unpublished_share_devices(self._unpublished_shares)

    def _on_publish(self, name: str) -> None:
        if name in ("sync_error", "field_dropped"):
            self.metrics.count_error("publish")

    def _claim_records(self) -> list[ClaimRecord]:
        state, _ = self.checkpoint.load()
        return list(state.claims.values())

    # ----- the API server's features -----------------------------------------------------

    def _pod_group_version(self) -> str | None:
        return self.features.pod_group_version if self.features is not None else None

    def discover_features(self) -> ServerFeatures:
        """Discovery (and the layout dry run); logs and exports what is unavailable."""
        features = discover(self._kube, self.settings.node_name, self.settings.driver_name)
        for feature, loss in features.unavailable.items():
            log.warning(
                "feature unavailable on this API server feature=%s server=%s loss=%r",
                feature,
                features.server_version,
                loss,
                extra={"node": self.settings.node_name, "feature": feature},
            )
        self.metrics.set_features_unavailable(LOSSES, features.unavailable)
        if features.pod_group_version is None:
            log.info(
                "workload claims unavailable server=%s reason=%r effect=%r",
                features.server_version,
                POD_GROUPS_NOT_SERVED,
                "a claim reserved for a PodGroup fails at prepare with this reason; claims "
                "reserved for pods are unaffected",
                extra={"node": self.settings.node_name},
            )
        self.features = features
        self._missing_api = (
            None
            if features.resource_v1
            else f"API server {features.server_version} does not serve resource.k8s.io/v1 "
            "ResourceSlices; Tranche needs Kubernetes >= 1.34 with DRA enabled"
        )
        return features

    def _discover_when_reachable(self, stop: threading.Event) -> bool:
        delay = 0.5
        while not stop.is_set():
            try:
                self.discover_features()
                return True
            except ApiUnavailable as e:
                log.warning("discovery waits for the API server retry_s=%.1f error=%s", delay, e)
            if stop.wait(delay):
                break
            delay = min(delay * 2, 30.0)
        return False

    def _on_reconnect(self) -> None:
        """Discovery again once the API server is back; a failure is the publisher's to
        report and retry (its error keeps ``/readyz`` failing until discovery succeeds)."""
        old = self.features
        new = self.discover_features()
        if old is None or new.slice_layout != old.slice_layout:
            log.info(
                "slice layout changed after reconnect old=%s new=%s",
                old.slice_layout if old else "none",
                new.slice_layout,
            )
            self.republish()

    def prepared_count(self) -> int:
        state, _ = self.checkpoint.load()
        return sum(1 for r in state.claims.values() if r.state == "PrepareCompleted")

    def _node_event(self, type: EventType, reason: str, message: str) -> None:
        self.events.record(ObjectRef.node(self.settings.node_name), type, reason, message)

    def _on_health_change(self, change: HealthChange) -> None:
        self._health_events(change)
        self.republish()

    # ----- lifecycle ------------------------------------------------------------------------

    def start(
        self, stop: threading.Event | None = None, *, node: Mapping[str, Any] | None = None
    ) -> bool:
        """Recover, publish, serve. False when ``stop`` was set while waiting for the API
        server (the device plugin check needs it before any socket opens). ``node``: the
        Node, when the caller has just read it (the dynamic-MIG label), so it is not read
        twice."""
        if self.settings.device_plugin_check:
            if node is not None:
                check_no_device_plugin(node)
            elif not check_node_when_reachable(
                lambda: check_node(self._kube, self.settings.node_name), stop or threading.Event()
            ):
                return False
        if not self._discover_when_reachable(stop or threading.Event()):
            return False
        if self._missing_api is not None:
            log.error(
                "cannot publish devices node=%s error=%s",
                self.settings.node_name,
                self._missing_api,
            )
        self.recovery = self.state.recover()
        status = self.recovery.checkpoint
        if status.kind == "corrupt":
            self.metrics.count_error("checkpoint")
            self._node_event("Warning", "CheckpointCorrupt", status.message)
        for uid, problem in self.recovery.failed.items():
            self._node_event("Warning", "ClaimRecoveryFailed", f"claim {uid}: {problem}")
        self.metrics.prepared_claims_from(self.prepared_count)
        self.metrics.held_claims_from(lambda: len(self.checkpoint.holds()))
        self.sharing.start()
        if self.device_plugins is not None:
            self.device_plugins.start()  # a device plugin deployed later stops new prepares
        self.namespaces.start()
        self.metrics.watch_current_from("namespaces", self.namespaces.watching)
        self.runtime_errors.start()
        self.metrics.watch_current_from("pods", self.runtime_errors.watching)
        self.republish()  # the slices are built and queued; written once the sockets are open
        self.watcher.start()
        self.sweeper.start()
        self.server.start()
        # The first sync (a list, a write and a check per slice) would compete for the
        # interpreter with opening the sockets the kubelet waits for; it follows them.
        self.publisher.start()
        self._sampler_thread.start()
        log.info(
            "plugin started node=%s driver=%s gpus=%d devices=%d",
            self.settings.node_name,
            self.settings.driver_name,
            len(self.inventory.gpus),
            self._published_devices,
        )
        return True

    def stop(self, grace: float = 10.0, drain: float = DRAIN_S) -> None:
        self._stop.set()
        self.server.stop(grace, drain)
        self.watcher.stop()
        self.sweeper.stop(timeout=5)
        self.sharing.stop()
        if self.device_plugins is not None:
            self.device_plugins.stop()
        self.publisher.stop()
        self.namespaces.stop()
        self.runtime_errors.stop()
        if isinstance(self.driver, StatusWritingDriver):
            self.driver.close()
        self.plugin_driver.close()
        self.events.close()
        if self._sampler_thread.is_alive():
            self._sampler_thread.join(timeout=5)

    def _sample_loop(self) -> None:
        # Start-up's slice building leaves freed heap pages behind, and its imports cyclic
        # garbage: both go once the first publish is done (or the first sample is due), then
        # freed pages after each sample (bursts of prepares leave them too).
        deadline = time.monotonic() + self.settings.sample_interval_s
        settle_after_start(
            self.publisher.wait_published, self._stop, self.settings.sample_interval_s
        )
        while not self._stop.wait(max(0.0, deadline - time.monotonic())):
            deadline = time.monotonic() + self.settings.sample_interval_s
            try:
                self.sampler.sample_once()
            except Exception as e:  # the loop must outlive any one bad sample
                log.exception("usage sample failed node=%s error=%s", self.settings.node_name, e)
                self.metrics.count_error(error_reason(e))
            release_freed_memory()

    def probe_paths(self) -> tuple[str, str]:
        return self.server.registration_socket, self.server.endpoint

    def ready(self) -> str | None:
        """Why this instance should not take the node's work yet (``/readyz``); None when it
        should. Registered with the kubelet is part of it: a rolling update deletes the old
        pod once the new one is ready, and until the kubelet has registered the new
        instance it sends every prepare to the old one, which is then shutting down. So are
        the published slices: until then the scheduler sees no device of this instance."""
        return (
            self._missing_api or self.publisher.error or self._unpublished() or self._unregistered()
        )

    def _unpublished(self) -> str | None:
        return None if self.publisher.published else "ResourceSlices not published yet"

    def _unregistered(self) -> str | None:
        status = self.server.registration.latest
        if status is None:
            return "not registered with the kubelet yet"
        if not status.registered:
            return f"the kubelet refused the registration: {status.error}"
        return None
