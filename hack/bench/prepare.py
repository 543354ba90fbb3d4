"""Issue 4: prepare/unprepare latency of one claim, a 240-claim burst, plugin memory.

Everything goes through the real plugin process (``tranche kubelet-plugin`` over
the simulated NVML) on its real gRPC socket, and the plugin reads every claim and
its namespace from the real API server. Claims are allocated by writing
``status.allocation`` (see :mod:`hack.bench.claims`). The calls are made first by the
Python client of :mod:`hack.kubeletsim`, then, in rows of their own, by the kubelet's own
gRPC client (:mod:`hack.bench.go_kubelet`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from driver.devices.inventory import build_inventory
from driver.nvml.sim import open_simulated
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP
from hack.bench import go_driver, go_kubelet
from hack.bench.claims import TIME_SLICING, Wanted, create_allocated
from hack.bench.lab import RESOURCE_V1, BenchNode, Lab, plugin_pid, request_json
from hack.bench.machine import cpu_seconds, rss_bytes, wait_idle
from hack.bench.results import Row, ScenarioResult, median, ms, percentile, timing
from hack.kubeletsim.client import ClaimRequest, PluginConnection

NAME = "prepare"
TITLE = "Prepare and unprepare (issue 4)"
NEEDS_CLUSTER = True
WARMUP = 5
SINGLE_RUNS = 200
BURST = 240
CONCURRENCY = 16
MIB = 1 << 20
KUBELET_CLIENT = "the kubelet's gRPC client"


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def _check(answers: dict[str, str], what: str) -> None:
    bad = {uid: err for uid, err in answers.items() if err}
    if bad:
        uid, err = next(iter(bad.items()))
        raise RuntimeError(f"{what}: {len(bad)} claims failed, e.g. {uid}: {err}")


def _prepare(conn: PluginConnection, claim: ClaimRequest) -> tuple[float, str]:
    t0 = time.perf_counter()
    answer = conn.prepare([claim])[claim.uid]
    return time.perf_counter() - t0, answer.error


def _unprepare(conn: PluginConnection, claim: ClaimRequest) -> tuple[float, str]:
    t0 = time.perf_counter()
    error = conn.unprepare([claim])[claim.uid]
    return time.perf_counter() - t0, error


def run(lab: Lab | None) -> ScenarioResult:
    assert lab is not None
    result = ScenarioResult(NAME, TITLE)
    result.setup.append(
        "One simulated `dgx-h100` node running the real plugin process from this checkout (its "
        "virtual environment's interpreter; the scenario `installed` runs the image)."
    )
    measure(lab, lab.node("prep"), "bench-prepare", result)
    return result


def go_rows(
    lab: Lab,
    bench: BenchNode,
    result: ScenarioResult,
    *,
    pid: int,
    socket: str,
    namespace: str,
    gpus: list[str],
) -> None:
    """The single claim and a burst again, as the kubelet's own gRPC client makes the calls
    (:mod:`hack.bench.go_kubelet`), after the Python client's rows (and its RSS readings),
    alternated with a Go driver's (:mod:`hack.bench.go_driver`), whose rows follow."""
    client = go_kubelet.build()
    (single,) = create_allocated(lab.api, namespace, bench.name, [Wanted("single-k", gpus[0])])
    with go_driver.beside(lab, namespace) as peer:
        wait_idle(pid)  # the Python client's status writes done, the claim's creation digested
        mine, theirs = (socket, single), (str(peer.driver.socket), peer.claim)
        go, go_peer = go_driver.alternated(
            client, mine, theirs, "single", warmup=WARMUP, rounds=SINGLE_RUNS,
            settle=lambda: wait_idle(pid),
        )  # fmt: skip
        empty, empty_peer = go_driver.alternated(
            client, mine, theirs, "empty", warmup=WARMUP, rounds=SINGLE_RUNS, settle=lambda: None
        )
        wanted = [Wanted(f"k-{i:03d}", gpus[i % len(gpus)], TIME_SLICING) for i in range(BURST)]
        claims = create_allocated(lab.api, namespace, bench.name, wanted)
        wait_idle(pid)
        cpu = cpu_seconds(pid)
        burst = go_kubelet.call(client, socket, "burst", claims, concurrency=CONCURRENCY)
        cpu = cpu_seconds(pid) - cpu
        _kubelet_client_rows(result, go, empty, burst, cpu)
        go_driver.rows(
            lab,
            result,
            namespace,
            go_driver.Measured(single=go, empty=empty, burst=burst, burst_cpu_s=cpu),
            peer,
            client=client,
            single=go_peer,
            empty=empty_peer,
            burst=BURST,
            concurrency=CONCURRENCY,
        )


def _kubelet_client_rows(
    result: ScenarioResult,
    go: go_kubelet.Calls,
    empty: go_kubelet.Calls,
    burst: go_kubelet.Calls,
    cpu: float,
) -> None:
    p99 = percentile(go.prepare, 99)
    result.add(
        Row(
            f"Prepare, one whole-GPU claim, {KUBELET_CLIENT}",
            f"p50 {ms(median(go.prepare))}, p99 {ms(p99)}",
            len(go.prepare),
            "p50 < 3.00 ms, p99 < 6.00 ms",
            median(go.prepare) < 0.003 and p99 < 0.006,
        )
    )
    result.add(timing(f"Unprepare, one whole-GPU claim, {KUBELET_CLIENT}", go.unprepare, 0.001))
    result.add(
        timing(f"A call with no claims (the gRPC round trip), {KUBELET_CLIENT}", empty.unprepare)
    )
    result.add(
        Row(
            f"Burst: {BURST} claims prepared, {CONCURRENCY} calls in flight (wall), "
            f"{KUBELET_CLIENT}",
            ms(burst.prepare_wall),
            BURST,
            "< 900 ms",
            burst.prepare_wall < 0.9,
        )
    )
    result.add(timing(f"Burst: latency of each prepare call, {KUBELET_CLIENT}", burst.prepare))
    result.add(
        Row(
            f"Burst: {BURST} claims unprepared (wall), {KUBELET_CLIENT}",
            ms(burst.unprepare_wall),
            BURST,
        )
    )
    result.add(
        Row(f"Plugin CPU for the {BURST}-claim burst and its unprepares, {KUBELET_CLIENT}", ms(cpu))
    )


def measure(lab: Lab, bench: BenchNode, namespace_name: str, result: ScenarioResult) -> None:
    """The rows of this scenario, measured on ``bench``'s plugin (started, not yet connected),
    and how they were measured (``result.setup``)."""
    conn = bench.connect()
    nvml = open_simulated(bench.node.sim_state)
    gpus = [g.name for g in build_inventory(nvml.list_gpus(), nvml.system_info()).gpus]
    lab.wait_slices(bench.name, 1)
    pid = plugin_pid(bench.node)
    time.sleep(2)  # let start-up work (first publish, watch) settle
    rss_idle = rss_bytes(pid)

    namespace = lab.namespace(namespace_name, {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "bench"})
    (single,) = create_allocated(lab.api, namespace, bench.name, [Wanted("single", gpus[0])])
    # Measured once the machine is quiet again: the controllers act on the new namespace and
    # claim for a second or two, which the first rounds measured as the plugin's time.
    wait_idle(pid)
    prep, unprep = [], []
    cpu_start = 0.0
    for i in range(WARMUP + SINGLE_RUNS):
        if i == WARMUP:
            cpu_start = cpu_seconds(pid)  # the measured rounds only
        p, perr = _prepare(conn, single)
        u, uerr = _unprepare(conn, single)
        _check({single.uid: perr or uerr}, "single claim")
        if i >= WARMUP:
            prep.append(p)
            unprep.append(u)
    cpu_single = cpu_seconds(pid) - cpu_start
    p99 = percentile(prep, 99)
    result.add(
        Row(
            "Prepare, one whole-GPU claim (API read + executor)",
            f"p50 {ms(median(prep))}, p99 {ms(p99)}",
            len(prep),
            "p50 < 3.00 ms, p99 < 6.00 ms",
            median(prep) < 0.003 and p99 < 0.006,
        )
    )
    result.add(timing("Unprepare, one whole-GPU claim", unprep, 0.001))

    wanted = [Wanted(f"b-{i:03d}", gpus[i % len(gpus)], TIME_SLICING) for i in range(BURST)]
    claims = create_allocated(lab.api, namespace, bench.name, wanted)
    wait_idle(pid)  # the single claim's status writes done, the 240 claims' creation digested
    cpu_burst = cpu_seconds(pid)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        t0 = time.perf_counter()
        prepared = list(pool.map(lambda c: _prepare(conn, c), claims))
        burst_s = time.perf_counter() - t0
    _check({c.uid: err for c, (_, err) in zip(claims, prepared, strict=True)}, "burst prepare")
    rss_burst = rss_bytes(pid)
    claim_files = list((bench.node.data_dir / "checkpoint.d").glob("*.json"))
    checkpoint_kib = sum(p.stat().st_size for p in claim_files) / 1024
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        t0 = time.perf_counter()
        unprepared = list(pool.map(lambda c: _unprepare(conn, c), claims))
        unburst_s = time.perf_counter() - t0
    _check({c.uid: err for c, (_, err) in zip(claims, unprepared, strict=True)}, "burst unprepare")
    cpu_burst = cpu_seconds(pid) - cpu_burst
    rss_after = rss_bytes(pid)

    result.add(
        Row(
            f"Burst: {BURST} claims prepared, {CONCURRENCY} calls in flight (wall)",
            ms(burst_s),
            BURST,
            "< 900 ms",
            burst_s < 0.9,
        )
    )
    result.add(timing("Burst: latency of each prepare call", [p for p, _ in prepared]))
    result.add(Row(f"Burst: {BURST} claims unprepared (wall)", ms(unburst_s), BURST))
    result.add(
        Row(
            "Plugin CPU per claim, prepared and unprepared one at a time",
            ms(cpu_single / SINGLE_RUNS),
            SINGLE_RUNS,
        )
    )
    result.add(
        Row(f"Plugin CPU for the {BURST}-claim burst and its unprepares", ms(cpu_burst), BURST)
    )
    result.add(
        Row(
            f"Checkpoint with {BURST} claims prepared (one file per claim)",
            f"{len(claim_files)} files, {checkpoint_kib:.0f} KiB",
        )
    )
    go_rows(
        lab,
        bench,
        result,
        pid=pid,
        socket=conn.registration.endpoint,
        namespace=namespace,
        gpus=gpus,
    )
    reads = []
    for _ in range(SINGLE_RUNS // 4):
        t0 = time.perf_counter()
        request_json(lab.api, "GET", f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/single")
        request_json(lab.api, "GET", f"/api/v1/namespaces/{namespace}")
        reads.append(time.perf_counter() - t0)
    result.add(timing("For comparison: GET claim + GET namespace, one after the other", reads))
    result.add(
        Row("Plugin RSS idle (after start)", _mib(rss_idle), None, "< 60 MiB", rss_idle < 60 * MIB)
    )
    result.add(
        Row(
            f"Plugin RSS with {BURST} claims prepared",
            _mib(rss_burst),
            None,
            "idle + 5 MiB",
            rss_burst <= rss_idle + 5 * MIB,
        )
    )
    result.add(
        Row(
            "Plugin RSS after unpreparing them",
            _mib(rss_after),
            None,
            "idle + 5 MiB",
            rss_after <= rss_idle + 5 * MIB,
        )
    )
    result.setup.append(
        f"The benchmark plays a 1.37 kubelet on the plugin's gRPC socket (`v1.DRAPlugin`), "
        f"first with the Python client of `hack.kubeletsim` (grpcio, whose own work adds to "
        f"each call), then, in the rows that say so, with {KUBELET_CLIENT}: grpc-go and the "
        f"stubs of the upstream `k8s.io/kubelet` v0.37.2 module, as the kubelet makes its calls "
        f"(`hack/kubeletclient`, built by `hack/build-kubeletclient.sh`), on a claim and 240 "
        f"claims of its own after the RSS readings; a call with no claims is "
        f"`NodeUnprepareResources` with an empty list. "
        f"Claims are created by the admin client and allocated by writing `status.allocation` "
        f"through the status subresource (no scheduler), in a namespace labelled trust level "
        f"`shared`. Single claim: one whole GPU, no config, prepared then unprepared "
        f"{SINGLE_RUNS} times after {WARMUP} warm-up rounds, one call at a time. Burst: {BURST} "
        f"claims, {BURST // len(gpus)} per GPU with a `TimeSlicing` GpuConfig (time-slice "
        f"sharing of one GPU by many claims), one `NodePrepareResources` call per claim (one pod "
        f"each), {CONCURRENCY} calls in flight on one channel, as the kubelet prepares pods in "
        "parallel. RSS is `VmRSS` of `/proc/<pid>/status`; CPU is the plugin process's user and "
        "system time (`/proc/<pid>/stat`, all threads, 10 ms ticks), which the machine's other "
        "work changes less than it changes wall time."
    )
