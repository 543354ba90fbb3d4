"""The device plugin check waits for an unreachable API server instead of failing the start."""

from __future__ import annotations

import threading

import pytest

from driver.devices.bridge import DevicePluginConflictError
from driver.errors import ApiUnavailable
from kubelet_plugin.bridge_check import check_node_when_reachable


def test_unreachable_api_server_is_retried_until_it_answers() -> None:
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ApiUnavailable("read node n1: the API server cannot be reached")

    assert check_node_when_reachable(check, threading.Event(), initial_s=0.01)
    assert len(calls) == 3


def test_a_stop_while_waiting_ends_the_wait() -> None:
    stop = threading.Event()

    def check() -> None:
        stop.set()
        raise ApiUnavailable("down")

    assert not check_node_when_reachable(check, stop, initial_s=0.01)


def test_a_conflict_is_not_retried() -> None:
    def check() -> None:
        raise DevicePluginConflictError("node n1: status.allocatable[nvidia.com/gpu] is 8")

    with pytest.raises(DevicePluginConflictError):
        check_node_when_reachable(check, threading.Event(), initial_s=0.01)
