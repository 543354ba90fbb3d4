"""``tranche kubelet-plugin``: the node process of the DaemonSet.

Settings are validated once; then the whole object graph is wired
(:class:`~kubelet_plugin.node.NodePlugin`) before any socket opens. SIGTERM
stops accepting calls, lets in-flight calls finish, and removes the sockets; so does
every other way out once they exist (a start that fails after them, an unexpected
error). Exit status: 0 stopped by a signal, 1 failed (the cause logged), 2 a bad setting.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

import pynvml
from prometheus_client import CollectorRegistry

from driver.cli import Command
from driver.devices.inventory import AdvertiseConfig
from driver.errors import ConfigError, TrancheError
from driver.kube.http import KubeClient
from driver.logs import LogOutput, configure
from driver.metrics import Metrics
from driver.nvml.driver_root import DriverRoot, load_nvml
from driver.nvml.facade import Nvml
from driver.nvml.host import NvidiaSmiTimeslice, SysfsHost
from kubelet_plugin.http_endpoint import listen, metrics_route
from kubelet_plugin.liveness import health_routes, probe_sockets
from kubelet_plugin.memory import limit_arenas
from kubelet_plugin.node import NodePlugin
from kubelet_plugin.node_labels import NodeLabelWatch, node_advertise
from kubelet_plugin.settings import (
    PluginSettings,
    add_arguments,
    settings_from_args,
)

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
STARTING = "starting: recovering claims, waiting for the API server"


def open_nvml(
    settings: PluginSettings, on_call: Callable[[str, float], None], lib: Any = pynvml
) -> Nvml:
    """The real libnvidia-ml of ``--driver-root``, loaded by its path (and ``nvidia-smi`` from
    there too), or the simulation (file-backed with ``--sim-state``)."""
    if settings.nvml == "real":
        root = DriverRoot(settings.driver_root)
        load_nvml(root, lib)
        timeslice = NvidiaSmiTimeslice(root.binary("nvidia-smi"))
        host = SysfsHost(proc_root=settings.proc_root)
        nvml = Nvml(lib, host=host, timeslice=timeslice, on_call=on_call)
        nvml.init()
        return nvml
    # Imported here: a real node never loads the simulation (about 140 ms and several MiB).
    from driver.nvml.sim import create_state, open_simulated  # noqa: PLC0415

    path = settings.sim_state
    if path is not None and path.exists():
        return open_simulated(path, on_call=on_call)
    if path is not None:
        # The chart keeps it in the plugin's state directory, which the first start creates.
        path.parent.mkdir(parents=True, exist_ok=True)
    store = create_state(settings.profile, path, node=settings.node_name)
    return open_simulated(store, on_call=on_call)


def serve(
    settings: PluginSettings,
    stop: threading.Event,
    restart: threading.Event,
    logs: LogOutput | None = None,
) -> int:
    """Run the plugin until ``stop``. A change of the node's dynamic-MIG label sets
    ``restart`` and stops the plugin, for the caller to start again. ``logs``: the log
    output, whose dropped records the metrics count."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, log_dropped=logs.dropped if logs is not None else None)
    nvml = open_nvml(settings, metrics.nvml_call)
    kube = KubeClient.connect(settings.kubeconfig)
    plugins: list[NodePlugin] = []  # the plugin, once built (after the node label is read)
    stoppers: list[Callable[[], None]] = []
    try:
        if settings.metrics_address:
            metrics_endpoint = listen(
                settings.metrics_address,
                "--metrics-address",
                {"/metrics": metrics_route(registry)},
                "metrics-endpoint",
            )
            stoppers.append(metrics_endpoint.stop)
        # The probes answer from the first moment: while the start waits for the API server
        # (an outage, a slow control plane) the plugin is alive and not ready, so a liveness
        # probe does not restart it into the same wait.
        started = threading.Event()
        if settings.health_address:
            routes = health_routes(
                live=lambda: (
                    probe_sockets(
                        *plugins[0].probe_paths(),
                        settings.driver_name,
                        plugins[0].server.oldest_call_s,
                    )
                    if started.is_set()
                    else None
                ),
                ready=lambda: plugins[0].ready() if started.is_set() else STARTING,
            )
            endpoint = listen(
                settings.health_address, "--health-address", routes, "health-endpoint"
            )
            stoppers.append(endpoint.stop)
        # What the node advertises depends on its dynamic-MIG label: read before the inventory.
        read = node_advertise(
            kube, settings.node_name, settings.mig_node_label, settings.advertise, stop
        )
        if read is None:
            return 0  # stopped while waiting for the API server
        advertise, node = read
        plugin = NodePlugin(
            settings.model_copy(update={"advertise": advertise}), kube, nvml, registry, metrics
        )
        plugins.append(plugin)
        # Stopped on every way out from here, a start that fails after its sockets opened
        # included: the kubelet would go on finding a registration socket nobody serves.
        stoppers.append(lambda: plugin.stop(STOP_GRACE_S))
        if not plugin.start(stop, node=node):
            return 0  # stopped while waiting for the API server
        started.set()

        def relabelled(_chosen: AdvertiseConfig) -> None:
            restart.set()
            stop.set()

        labels = NodeLabelWatch(
            kube,
            settings.node_name,
            settings.mig_node_label,
            base=settings.advertise,
            current=advertise,
            on_change=relabelled,
            # The device-plugin check judges each version of the Node the watch delivers,
            # and reads the Node itself only while the watch does not run.
            on_node=plugin.device_plugins.observe if plugin.device_plugins else None,
        )
        if plugin.device_plugins is not None:
            plugin.device_plugins.follow(labels.watching)
        labels.start()
        metrics.watch_current_from("node", labels.watching)
        stoppers.append(labels.stop)
        stop.wait()
        log.info("stopping node=%s", settings.node_name)
    finally:
        for fn in [*reversed(stoppers), nvml.shutdown, kube.close]:
            _stop_step(fn, settings.node_name)
    return 0


def _stop_step(fn: Callable[[], None], node: str) -> None:
    """One step of the stop; one that fails is logged and the next steps still run (the
    plugin's own stop, which removes the sockets, comes after the label watch's)."""
    try:
        fn()
    except Exception as e:
        log.exception("stop step failed node=%s error=%s", node, e)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ConfigError as e:
        print(f"tranche kubelet-plugin: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(settings.model_dump_json(indent=2))
        return 0
    limit_arenas()  # before any thread starts
    # Log lines are formatted and written by a thread of their own, off the kubelet's calls.
    write_out_logs = configure(settings.log_format, settings.log_level, background=True)
    stop = threading.Event()
    restart = threading.Event()  # set by the node label watch
    signalled = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal received signal=%s", signal.Signals(signum).name)
        signalled.set()
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # A restart in place blocks the stop signals across its exec: one sent meanwhile is
    # pending, and arrives here.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        code = serve(settings, stop, restart, write_out_logs)
    except TrancheError as e:
        log.error("kubelet plugin failed to start: %s", e)
        write_out_logs()
        return 1
    except Exception as e:  # a bug or the system (a thread refused): logged, not a bare traceback
        log.exception("kubelet plugin failed node=%s error=%s", settings.node_name, e)
        write_out_logs()
        return 1
    if restart.is_set():
        # A stop signal before this line wins over the restart; one after it waits, pending,
        # for the new start, which stops at once.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        if not signalled.is_set():
            restart_in_place(write_out_logs)
    write_out_logs()
    return code


def restart_in_place(write_out_logs: Callable[[], None]) -> NoReturn:
    """Run this command again in this process, after a clean stop: the same PID and
    container, so no container restart is counted and no back-off applies. Every file
    descriptor the plugin opened is closed by the exec (Python opens them non-inheritable);
    child processes (MPS control daemons) stay and the new start adopts them as after any
    restart."""
    log.info("restarting in place for the node label")
    write_out_logs()  # the exec ends the writer thread with whatever it still holds
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])  # noqa: S606 (this very command)


command = Command(
    help="Run the kubelet plugin of one GPU node (the DaemonSet's process).",
    add_arguments=add_arguments,
    run=run,
)
