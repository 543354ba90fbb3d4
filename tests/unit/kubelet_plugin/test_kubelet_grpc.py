"""The kubelet-facing gRPC servers, driven by the kubelet simulator over real Unix sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from driver.api import ClaimRef, DeviceHealth
from driver.errors import ApiUnavailable, ConfigError
from hack.kubeletsim import ClaimRequest, KubeletSimulator
from hack.kubeletsim.client import (
    STYLES,
    PluginConnection,
    RegistrationRejectedError,
    choose_services,
    register,
)
from kubelet_plugin.grpc_server import PluginServer, dra_socket_name, registration_socket_name
from proto.gen.dra.v1 import api_pb2 as dra_v1
from proto.gen.dra.v1 import api_pb2_grpc as dra_v1_grpc
from proto.gen.pluginregistration import api_pb2 as reg
from proto.gen.pluginregistration import api_pb2_grpc as reg_grpc
from tests.unit.kubelet_doubles import RecordingDriver, SettableHealth

DRIVER = "gpu.tranche.dev"
ALL_SERVICES = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
]


@pytest.fixture
def root(short_tmp: Path) -> Path:
    return short_tmp


@pytest.fixture
def driver() -> RecordingDriver:
    return RecordingDriver()


@pytest.fixture
def health() -> SettableHealth:
    return SettableHealth([DeviceHealth("node-a", "gpu-0", "Healthy")])


@pytest.fixture
def server(root: Path, driver: RecordingDriver, health: SettableHealth) -> Iterator[PluginServer]:
    srv = PluginServer(DRIVER, root, driver, health=health)
    srv.start()
    yield srv
    driver.block.set()
    srv.stop(grace=1)


def _sim(root: Path, style: str) -> KubeletSimulator:
    return KubeletSimulator("node-a", root, version_style=style, poll_interval=0.05)


@pytest.fixture
def sims() -> Iterator[list[KubeletSimulator]]:
    started: list[KubeletSimulator] = []
    yield started
    for sim in started:
        sim.stop()


def _registered(sim: KubeletSimulator, count: int = 1) -> None:
    sim.start()
    assert sim.wait_for(lambda: len(sim.registrations()) == count), sim.calls


def test_get_info_answers_type_name_absolute_endpoint_and_services(server: PluginServer) -> None:
    with grpc.insecure_channel(f"unix:{server.registration_socket}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == server.endpoint
    assert Path(info.endpoint).is_absolute()
    assert Path(info.endpoint).parent == server.plugin_data_dir
    assert list(info.supported_versions) == ALL_SERVICES
    assert Path(server.registration_socket).parent.name == "plugins_registry"


def test_without_health_source_no_health_service_is_advertised(
    root: Path, driver: RecordingDriver
) -> None:
    srv = PluginServer(DRIVER, root, driver)
    srv.start()
    try:
        registration = register(STYLES["1.37"], srv.registration_socket, timeout=10)
    finally:
        srv.stop(0)
    assert registration.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert registration.health_service == ""


def test_registration_sequence_records_the_kubelets_verdict(
    server: PluginServer, root: Path, sims: list[KubeletSimulator]
) -> None:
    sim = _sim(root, "1.37")
    sims.append(sim)
    _registered(sim)
    assert server.registration.wait(5) is not None
    latest = server.registration.latest
    assert latest is not None
    assert latest.registered
    (registration,) = sim.registrations()
    assert registration.driver == DRIVER
    assert registration.endpoint == server.endpoint
    assert registration.dra_service == "v1.DRAPlugin"
    assert registration.health_service == "v1.DRAResourceHealth"


def test_rejected_registration_is_recorded(server: PluginServer) -> None:
    with grpc.insecure_channel(f"unix:{server.registration_socket}") as channel:
        reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="driver name taken"), timeout=5
        )
    latest = server.registration.latest
    assert latest is not None
    assert not latest.registered
    assert latest.error == "driver name taken"


def test_kubelet_without_a_common_version_rejects_the_plugin() -> None:
    info = reg.PluginInfo(type="DRAPlugin", name=DRIVER, supported_versions=["v1.DRAPlugin"])
    with pytest.raises(RegistrationRejectedError, match="none of the services"):
        choose_services(STYLES["1.33"], info)


@pytest.mark.parametrize(
    ("style", "service", "has_share_id"),
    [
        ("1.33", "v1beta1.DRAPlugin", False),
        ("1.34", "v1.DRAPlugin", True),
        ("1.37", "v1.DRAPlugin", True),
    ],
)
def test_prepare_and_unprepare_in_each_kubelet_version(
    server: PluginServer,
    driver: RecordingDriver,
    root: Path,
    sims: list[KubeletSimulator],
    style: str,
    service: str,
    has_share_id: bool,
) -> None:
    sim = _sim(root, style)
    sims.append(sim)
    _registered(sim)
    assert sim.registrations()[0].dra_service == service
    claims = [ClaimRequest("team-a", "uid-1", "train"), ClaimRequest("team-a", "uid-2", "eval")]

    answers = sim.prepare(DRIVER, claims)

    assert driver.prepared == [
        [ClaimRef("uid-1", "team-a", "train"), ClaimRef("uid-2", "team-a", "eval")]
    ]
    assert set(answers) == {"uid-1", "uid-2"}
    device = answers["uid-1"].devices[0]
    assert device.request_names == ("gpu", "nic")
    assert device.device_name == "gpu-train"
    assert device.pool_name == "node-a"
    assert device.cdi_device_ids == ("k8s.tranche.example.com/gpu=uid-1-0",)
    assert device.share_id == ("share-1" if has_share_id else None)

    assert sim.unprepare(DRIVER, claims) == {"uid-1": "", "uid-2": ""}
    assert driver.unprepared == driver.prepared
    # A first GetInfo past the kubelet's 1 s (a stalled machine) is retried, as the kubelet
    # does; the call that reached nobody is not part of what is compared.
    assert [c.method for c in sim.calls if c.answer != "unreachable"] == [
        "GetInfo+Notify",
        "NodePrepareResources",
        "NodeUnprepareResources",
    ]


def test_per_claim_errors_and_unanswered_claims_stay_per_claim(
    server: PluginServer, driver: RecordingDriver, root: Path, sims: list[KubeletSimulator]
) -> None:
    sim = _sim(root, "1.37")
    sims.append(sim)
    _registered(sim)
    driver.fail["uid-bad"] = "claim team-a/bad: config.sharing.strategy: unknown value 'x'"
    driver.omit.add("uid-lost")
    claims = [
        ClaimRequest("team-a", "uid-ok", "ok"),
        ClaimRequest("team-a", "uid-bad", "bad"),
        ClaimRequest("team-a", "uid-lost", "lost"),
    ]

    answers = sim.prepare(DRIVER, claims)

    assert set(answers) == {"uid-ok", "uid-bad", "uid-lost"}  # "not-requested-uid" dropped
    assert answers["uid-ok"].error == ""
    assert answers["uid-ok"].devices
    assert "config.sharing.strategy" in answers["uid-bad"].error
    assert "team-a/lost" in answers["uid-lost"].error
    assert "no result" in answers["uid-lost"].error
    assert set(sim.prepared) == {"uid-ok"}


def test_whole_call_failures_become_grpc_status(
    server: PluginServer, driver: RecordingDriver
) -> None:
    with grpc.insecure_channel(f"unix:{server.endpoint}") as channel:
        stub = dra_v1_grpc.DRAPluginStub(channel)
        bad = dra_v1.NodePrepareResourcesRequest(
            claims=[dra_v1.Claim(namespace="team-a", uid="", name="train")]
        )
        with pytest.raises(grpc.RpcError) as invalid:
            stub.NodePrepareResources(bad, timeout=5)
        assert invalid.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "claims[0].uid" in str(invalid.value.details())

        driver.raise_error = ApiUnavailable("resourceclaims team-a/train: API server unreachable")
        good = dra_v1.NodePrepareResourcesRequest(
            claims=[dra_v1.Claim(namespace="team-a", uid="u1", name="train")]
        )
        with pytest.raises(grpc.RpcError) as unavailable:
            stub.NodePrepareResources(good, timeout=5)
        assert unavailable.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "team-a/train" in str(unavailable.value.details())

        driver.raise_error = None  # the server keeps serving after a failed call
        response = stub.NodePrepareResources(good, timeout=5)
        assert response.claims["u1"].devices[0].device_name == "gpu-train"


def test_stale_sockets_are_replaced_at_start(root: Path, driver: RecordingDriver) -> None:
    first = PluginServer(DRIVER, root, driver)
    for path in (Path(first.endpoint), Path(first.registration_socket)):
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(path))
        stale.close()  # a socket file nobody listens on, as a crashed plugin leaves it
    first.start()
    try:
        registration = register(STYLES["1.37"], first.registration_socket, timeout=10)
        connection = PluginConnection(registration)
        answers = connection.prepare([ClaimRequest("ns", "u1", "c")])
        connection.close()
    finally:
        first.stop(0)
    assert answers["u1"].error == ""


def test_a_directory_in_the_socket_path_is_a_clear_error(
    root: Path, driver: RecordingDriver
) -> None:
    srv = PluginServer(DRIVER, root, driver)
    Path(srv.endpoint).mkdir(parents=True)
    with pytest.raises(ConfigError, match="is a directory"):
        srv.start()


def test_stop_finishes_calls_in_progress_while_registered_then_deregisters(
    server: PluginServer, driver: RecordingDriver
) -> None:
    """The kubelet closes its connection when it deregisters an instance, failing a call
    still in progress on it: a stopping plugin deregisters only once its calls are done."""
    driver.block.clear()
    result: dict[str, object] = {}

    def call() -> None:
        with grpc.insecure_channel(f"unix:{server.endpoint}") as channel:
            result["response"] = _prepare_one(channel, "u1")

    caller = threading.Thread(target=call)
    caller.start()
    assert driver.entered.wait(10)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 20})
    stopper.start()
    time.sleep(0.5)
    assert stopper.is_alive()  # stop() waits for the call in progress...
    assert Path(server.registration_socket).exists()  # ...with the kubelet still knowing it

    driver.block.set()
    caller.join(10)
    stopper.join(10)
    response = result["response"]
    assert isinstance(response, dra_v1.NodePrepareResourcesResponse)
    assert response.claims["u1"].devices[0].device_name == "gpu-c"
    assert not Path(server.registration_socket).exists()
    assert not Path(server.endpoint).exists()


def test_stop_deregisters_after_the_grace_even_if_a_call_hangs(
    server: PluginServer, driver: RecordingDriver
) -> None:
    driver.block.clear()
    channel = grpc.insecure_channel(f"unix:{server.endpoint}")
    call = dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources.future(
        dra_v1.NodePrepareResourcesRequest(
            claims=[dra_v1.Claim(namespace="ns", uid="u", name="c")]
        ),
        timeout=30,
    )
    try:
        assert driver.entered.wait(10)
        started = time.monotonic()
        server.stop(grace=0.3)
        assert time.monotonic() - started < 10
        assert not Path(server.registration_socket).exists()
        assert not Path(server.endpoint).exists()
    finally:
        driver.block.set()
        channel.close()  # cancels the call, if it still runs
        del call


def _prepare_one(channel: grpc.Channel, uid: str) -> dra_v1.NodePrepareResourcesResponse:
    request = dra_v1.NodePrepareResourcesRequest(
        claims=[dra_v1.Claim(namespace="ns", uid=uid, name="c")]
    )
    response: dra_v1.NodePrepareResourcesResponse = dra_v1_grpc.DRAPluginStub(
        channel
    ).NodePrepareResources(request, timeout=10)
    return response


def test_the_callers_deadline_reaches_the_driver_with_each_claim(
    server: PluginServer, driver: RecordingDriver
) -> None:
    """The kubelet's 45 s deadline (10 s here) travels with the claims, so a prepare that
    waited past it is abandoned (driver.prepare.prepare_path); without one, there is none."""
    request = dra_v1.NodePrepareResourcesRequest(
        claims=[dra_v1.Claim(namespace="ns", uid="u1", name="c")]
    )
    with grpc.insecure_channel(f"unix:{server.endpoint}") as channel:
        stub = dra_v1_grpc.DRAPluginStub(channel)
        before = time.monotonic()
        stub.NodePrepareResources(request, timeout=10)
        stub.NodePrepareResources(request)
    (with_deadline,), (without,) = driver.prepared
    assert with_deadline.deadline is not None
    # The server's deadline may lie a little past the client's: grpc rounds the timeout up to
    # encode it, and hands the server a wall-clock deadline converted from its monotonic clock
    # with an offset taken when grpc started. CI once saw 0.1 s; a second of slack still tells
    # the caller's 10 s from none.
    assert before + 8 < with_deadline.deadline <= time.monotonic() + 11
    assert without.deadline is None or without.deadline > time.monotonic() + 3600


def test_stop_serves_until_the_kubelet_drops_its_connection(server: PluginServer) -> None:
    """The kubelet deregisters an instance in its plugin manager's next round after the
    registration socket goes, and sends it prepares until then (a rolling update's old pod):
    those must succeed, not meet a server that is already shutting down."""
    kubelet = grpc.insecure_channel(f"unix:{server.endpoint}")
    grpc.channel_ready_future(kubelet).result(timeout=10)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 5, "drain": 30})
    stopper.start()
    deadline = time.monotonic() + 10
    while Path(server.registration_socket).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not Path(server.registration_socket).exists()

    time.sleep(0.3)  # the kubelet has not looked yet
    assert _prepare_one(kubelet, "u1").claims["u1"].devices[0].device_name == "gpu-c"
    assert stopper.is_alive()
    assert Path(server.endpoint).exists()

    kubelet.close()  # deregistered: the kubelet closes its connection
    stopper.join(10)  # well before the 30 s the drain may last
    assert not stopper.is_alive()
    assert not Path(server.endpoint).exists()


def test_stop_drains_at_most_the_time_given(server: PluginServer) -> None:
    """A kubelet that never lets go (or a client that is not the kubelet) holds the stop
    for the drain time, not forever."""
    kubelet = grpc.insecure_channel(f"unix:{server.endpoint}")
    try:
        grpc.channel_ready_future(kubelet).result(timeout=10)
        started = time.monotonic()
        server.stop(grace=0, drain=0.5)
        assert 0.5 <= time.monotonic() - started < 10
        assert not Path(server.endpoint).exists()
    finally:
        kubelet.close()


def test_rolling_update_two_instances_of_one_driver_serve_at_once(
    root: Path, sims: list[KubeletSimulator]
) -> None:
    old_driver, new_driver = RecordingDriver(), RecordingDriver()
    old = PluginServer(DRIVER, root, old_driver, rolling_update_uid="pod-old")
    new = PluginServer(DRIVER, root, new_driver, rolling_update_uid="pod-new")
    old.start()
    new.start()
    try:
        assert old.endpoint != new.endpoint
        assert old.registration_socket != new.registration_socket
        assert Path(old.endpoint).name == "dra-pod-old.sock"
        assert Path(new.registration_socket).name == f"{DRIVER}-pod-new-reg.sock"
        sim = _sim(root, "1.37")
        sims.append(sim)
        _registered(sim, count=2)
        for registration in sim.registrations():
            connection = PluginConnection(registration)
            answers = connection.prepare([ClaimRequest("ns", "u1", "c")])
            connection.close()
            assert answers["u1"].error == ""
        assert len(old_driver.prepared) == 1
        assert len(new_driver.prepared) == 1

        old.stop(1)  # the old pod goes away; the new one keeps serving
        assert Path(new.endpoint).exists()
        assert sim.wait_for(lambda: len(sim.registrations()) == 1)
        assert sim.prepare(DRIVER, [ClaimRequest("ns", "u2", "d")])["u2"].error == ""
        assert len(new_driver.prepared) == 2
    finally:
        old.stop(0)
        new.stop(0)


def test_rolling_update_socket_names_fit_unix_path_limit() -> None:
    registry = "/var/lib/kubelet/plugins_registry"
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    assert registration_socket_name(registry, "gpu.nvidia.com", uid) == (
        f"gpu.nvidia.com-{uid}-reg.sock"
    )
    deep = "/" + "d" * 30 + registry  # the full UID no longer fits
    hashed = registration_socket_name(deep, "gpu.nvidia.com", uid)
    assert hashed.startswith("gpu.nvidia.com-")
    assert uid not in hashed
    assert len(f"{deep}/{hashed}") <= 107
    long_driver = "a" * 40 + ".example.com"  # not even the UID hash fits next to it
    shortest = registration_socket_name(deep, long_driver, uid)
    assert shortest.startswith("dra-")
    assert len(f"{deep}/{shortest}") <= 107
    assert shortest != registration_socket_name(deep, long_driver, uid + "x")
    assert registration_socket_name(registry, "gpu.nvidia.com", None) == "gpu.nvidia.com-reg.sock"


def test_a_dra_socket_under_a_long_kubelet_root_gets_a_hashed_name_that_fits() -> None:
    """A real node's kubelet root of 52 bytes (the dev cluster's): the per-pod DRA socket
    with the full UID would be 122 bytes, and the plugin refused to start."""
    uid = "db788049-2e1d-4bb0-a817-9b3cfc86a7b4"
    assert dra_socket_name("/var/lib/kubelet/plugins/gpu.nvidia.com", uid) == f"dra-{uid}.sock"
    plugin_dir = "/tmp/pytest-of-root/pytest-217/dev-cluster0/n/rn1/kl/plugins/gpu.tranche.dev"
    name = dra_socket_name(plugin_dir, uid)
    assert uid not in name and name.startswith("dra-")
    assert len(f"{plugin_dir}/{name}") <= 107
    assert name != dra_socket_name(plugin_dir, uid + "x")
    assert dra_socket_name(plugin_dir, None) == "dra.sock"


@pytest.mark.parametrize(
    ("style", "service"), [("1.37", "v1.DRAResourceHealth"), ("1.34", "v1alpha1.DRAResourceHealth")]
)
def test_health_stream_delivers_full_device_list_on_every_change(
    server: PluginServer,
    health: SettableHealth,
    root: Path,
    sims: list[KubeletSimulator],
    style: str,
    service: str,
) -> None:
    sim = _sim(root, style)
    sims.append(sim)
    _registered(sim)
    assert sim.wait_for(lambda: len(sim.health_updates) >= 1)
    first = sim.health_updates[0]
    assert first.service == service
    assert [(d.device_name, d.health) for d in first.devices] == [("gpu-0", "Healthy")]

    health.set(
        [
            DeviceHealth("node-a", "gpu-0", "Unhealthy", message="XID 79: fell off the bus"),
            DeviceHealth("node-a", "gpu-1", "Healthy", timeout_seconds=60),
        ]
    )

    assert sim.wait_for(lambda: len(sim.health_updates) >= 2)
    latest = sim.health_updates[-1].devices
    assert [(d.device_name, d.health) for d in latest] == [
        ("gpu-0", "Unhealthy"),
        ("gpu-1", "Healthy"),
    ]
    assert latest[0].message == "XID 79: fell off the bus"
    assert latest[1].timeout_seconds == 60
    assert latest[0].last_updated_time > 0


def test_health_stream_resends_an_unchanged_list_before_the_kubelet_times_it_out(
    root: Path, driver: RecordingDriver, health: SettableHealth, sims: list[KubeletSimulator]
) -> None:
    # The kubelet turns a device Unknown when no message named it within its timeout
    # (30 s by default): a list sent only on change went Unknown a minute after start.
    srv = PluginServer(DRIVER, root, driver, health=health, health_resend_seconds=0.2)
    srv.start()
    try:
        sim = _sim(root, "1.37")
        sims.append(sim)
        _registered(sim)
        assert sim.wait_for(lambda: len(sim.health_updates) >= 3)
        for update in sim.health_updates[:3]:
            assert [(d.device_name, d.health) for d in update.devices] == [("gpu-0", "Healthy")]
            # a declared timeout, longer than the re-send period
            assert update.devices[0].timeout_seconds == 60
    finally:
        srv.stop(0)


def test_kubelet_137_opens_no_health_stream_unless_advertised(
    root: Path, driver: RecordingDriver, sims: list[KubeletSimulator]
) -> None:
    srv = PluginServer(DRIVER, root, driver)
    srv.start()
    try:
        sim = _sim(root, "1.37")
        sims.append(sim)
        _registered(sim)
        assert sim.registrations()[0].health_service == ""
        assert sim.prepare(DRIVER, [ClaimRequest("ns", "u1", "c")])["u1"].error == ""
        assert sim.health_updates == []
    finally:
        srv.stop(0)
