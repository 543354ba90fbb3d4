"""The slice publisher against an API server that goes away and comes back."""

from __future__ import annotations

import threading

from kubelet_plugin.publisher import Backoff, Publisher
from tests.unit.kubelet_plugin.slice_api import SliceApi, slice_of
from tests.waiting import wait_for

NODE, DRIVER = "node-a", "gpu.tranche.dev"


def test_a_failed_rediscovery_after_reconnect_is_reported_retried_and_publishing_goes_on() -> None:
    """Rediscovery once the API server is back may meet a bad answer (a page that is not
    JSON): the publisher names it in its error (``/readyz``), keeps publishing, and runs the
    rediscovery again until it succeeds."""
    api = SliceApi()
    broken = threading.Event()
    broken.set()
    tries: list[int] = []

    def rediscover() -> None:
        tries.append(1)
        if broken.is_set():
            raise ValueError("Expecting value: line 1 column 1 (char 0)")

    publisher = Publisher(api, DRIVER, NODE, backoff=Backoff(0.01, 0.05), on_reconnect=rediscover)
    api.down = True
    publisher.update([slice_of(NODE, DRIVER, ["gpu-0"])])
    publisher.start()
    try:
        wait_for("a failed sync", lambda: publisher.error, timeout_s=10)
        api.down = False
        wait_for(
            "the failed rediscovery in the publisher's error",
            lambda: "ValueError" in (publisher.error or ""),
            timeout_s=10,
        )
        publisher.update([slice_of(NODE, DRIVER, ["gpu-0", "gpu-1"])])
        wait_for("the new slices", lambda: api.devices() == ["gpu-0", "gpu-1"], timeout_s=10)
        broken.clear()
        wait_for("the error cleared", lambda: publisher.error is None, timeout_s=10)
        tried = len(tries)
        assert tried > 1
        publisher.update([slice_of(NODE, DRIVER, ["gpu-1"])])
        wait_for("the last slices", lambda: api.devices() == ["gpu-1"], timeout_s=10)
        assert len(tries) == tried  # done once it succeeded
    finally:
        publisher.stop()
        api.close()
