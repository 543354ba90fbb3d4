"""Which pods get a CDIDeviceRejected Event, and what it names (kubelet_plugin/runtime_errors)."""

from __future__ import annotations

from typing import Any

from driver.checkpoint.records import ClaimRecord, PreparedDeviceRecord
from driver.prepare.plan import Plan
from kubelet_plugin.runtime_errors import REASON, RuntimeErrorWatcher, rejections

CDI_MESSAGE = (
    "failed to create containerd container: CDI device injection failed: failed to inject "
    'devices: failed to stat CDI host device "/dev/nvidia-gone": no such file or directory'
)


def record(name: str, device: str, state: str = "PrepareCompleted") -> ClaimRecord:
    uid = f"uid-{name}"
    return ClaimRecord.model_validate(
        {
            "uid": uid,
            "namespace": "team",
            "name": name,
            "state": state,
            "plan": Plan(claim_uid=uid, devices=(), steps=()),
            "startedAt": 1.0,
            "devices": [
                PreparedDeviceRecord.model_validate(
                    {
                        "requestNames": ["gpu"],
                        "poolName": "node-a",
                        "deviceName": device,
                        "cdiDeviceIds": [f"gpu.tranche.dev/claim={uid}-{device}"],
                    }
                )
            ],
        }
    )


def pod(reason: str = "CreateContainerError", message: str = CDI_MESSAGE) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "team", "uid": "pod-uid"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                {"name": "other", "resourceClaimName": "shared"},
            ],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "side", "resources": {"claims": [{"name": "other"}]}},
            ],
        },
        "status": {
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x1"}],
            "containerStatuses": [
                {"name": "main", "state": {"waiting": {"reason": reason, "message": message}}},
                {"name": "side", "state": {"running": {}}},
            ],
        },
    }


def test_a_container_refused_over_cdi_names_its_claim_device_and_cdi_id() -> None:
    records = [record("train-gpu-x1", "gpu-0a1b2c3d"), record("shared", "gpu-11111111")]
    (found,) = rejections(pod(), records)
    assert (found.pod.kind, found.pod.name, found.pod.uid) == ("Pod", "train", "pod-uid")
    assert (found.container, found.claim_name, found.devices) == (
        "main",
        "train-gpu-x1",
        ("gpu-0a1b2c3d",),
    )
    text = found.message()
    assert "claim team/train-gpu-x1" in text and "gpu-0a1b2c3d" in text
    assert "gpu.tranche.dev/claim=uid-train-gpu-x1-gpu-0a1b2c3d" in text
    assert "failed to stat CDI host device" in text


def test_other_errors_and_claims_of_other_drivers_are_not_reported() -> None:
    records = [record("train-gpu-x1", "gpu-0a1b2c3d")]
    assert rejections(pod(message="exec: no such file"), records) == []
    assert rejections(pod(reason="ImagePullBackOff"), records) == []
    assert rejections(pod(), []) == [], "a claim this plugin did not prepare"
    assert rejections(pod(), [record("train-gpu-x1", "d", state="PrepareStarted")]) == []


def test_extended_resource_claim_maps_to_its_container() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    p["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "train-extended-resources-x",
        "requestMappings": [
            {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "r0"}
        ],
    }
    (found,) = rejections(p, [record("train-extended-resources-x", "gpu-0a1b2c3d")])
    assert found.claim_name == "train-extended-resources-x"


class _Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def record(self, obj: Any, type: str, reason: str, message: str) -> None:
        self.posted.append((obj.name, reason, message))


def test_the_same_rejection_is_posted_once_across_kubelet_retries() -> None:
    events = _Events()
    records = [record("train-gpu-x1", "gpu-0a1b2c3d")]
    watcher = RuntimeErrorWatcher(None, "node-a", lambda: records, events)  # type: ignore[arg-type]
    assert watcher.check(pod()) == 1
    assert watcher.check(pod()) == 0
    assert [(n, r) for n, r, _ in events.posted] == [("train", REASON)]
    assert watcher.check(pod(message=CDI_MESSAGE + " (again, differently)")) == 1
