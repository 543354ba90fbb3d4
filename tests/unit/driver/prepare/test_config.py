"""The opaque config API: validation, NVIDIA mapping and merge order."""

from __future__ import annotations

from typing import Any

import pytest

from driver.errors import ConfigError
from driver.prepare.config import (
    ConfigEntry,
    GpuConfig,
    MigDeviceConfig,
    config_for,
    parse_device_config,
    parse_entries,
)

V1 = "gpu.tranche.dev/v1alpha1"
NV = "resource.nvidia.com/v1beta1"
WHERE = "status.allocation.devices.config[0].opaque.parameters"


def gpu(sharing: dict[str, Any] | None = None, api: str = V1) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": api, "kind": "GpuConfig"}
    if sharing is not None:
        doc["sharing"] = sharing
    return doc


def test_defaults_to_exclusive() -> None:
    cfg = parse_device_config(gpu(), WHERE)
    assert isinstance(cfg, GpuConfig)
    assert cfg.sharing.strategy == "Exclusive"


def test_mps_settings_parse_quantities() -> None:
    cfg = parse_device_config(
        gpu(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
                },
            }
        ),
        WHERE,
    )
    assert cfg.sharing.mps is not None
    assert cfg.sharing.mps.default_active_thread_percentage == 50
    assert cfg.sharing.mps.default_pinned_device_memory_limit == 10 * 2**30
    assert cfg.sharing.mps.default_per_device_pinned_memory_limit == {"0": 5 * 2**30}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"apiVersion": "gpu.tranche.dev/v9", "kind": "GpuConfig"}, f"{WHERE}.apiVersion"),
        ({"apiVersion": V1, "kind": "TpuConfig"}, f"{WHERE}.kind"),
        (gpu({"strategy": "Exclusive", "colour": "red"}), f"{WHERE}.sharing.colour"),
        (gpu({"strategy": "Sometimes"}), f"{WHERE}.sharing.strategy"),
        # The checkpoint reads these models with unknown fields ignored; a claim's config not.
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentag": 50}}),
            f"{WHERE}.sharing.mpsConfig.defaultActiveThreadPercentag: Extra inputs are not "
            "permitted",
        ),
        (
            gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}),
            f"{WHERE}.sharing.timeSlicingConfig.intervall: Extra inputs are not permitted",
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}),
            f"{WHERE}.sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}),
            f"{WHERE}.sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
            f"{WHERE}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
            "below the minimum of 1Mi",
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1e5000"}}),
            f"{WHERE}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Value error, '1e5000' is "
            "out of range",
        ),
        (
            gpu(
                {
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1e5000"}},
                }
            ),
            f"{WHERE}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0: Value error, '1e5000'",
        ),
        (
            gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
            f"{WHERE}.sharing.timeSlicingConfig.interval",
        ),
        (
            gpu({"strategy": "Exclusive", "mpsConfig": {}}),
            "mpsConfig is allowed only with strategy MPS",
        ),
        ("not an object", f"{WHERE}: must be an object"),
        (gpu({"strategy": "Exclusive"}, api=NV), f"{WHERE}.sharing.strategy"),
    ],
)
def test_invalid_configs_name_the_field(doc: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_device_config(doc, WHERE)
    assert message in str(info.value)


def test_nvidia_configs_map_onto_ours() -> None:
    ts = parse_device_config(
        gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}, api=NV), WHERE
    )
    assert isinstance(ts, GpuConfig)
    assert (ts.sharing.strategy, ts.sharing.interval) == ("TimeSlicing", "Long")
    mps = parse_device_config(
        {
            "apiVersion": NV,
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}},
        },
        WHERE,
    )
    assert isinstance(mps, MigDeviceConfig)
    assert mps.sharing.mps is not None
    assert mps.sharing.mps.default_active_thread_percentage == 25
    assert parse_device_config(gpu(api=NV), WHERE).sharing.strategy == "Exclusive"
    with pytest.raises(ConfigError, match="timeSlicingConfig"):
        parse_device_config(
            {
                "apiVersion": NV,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}},
            },
            WHERE,
        )


def _entries(*raw: tuple[int, str, tuple[str, ...], Any]) -> list[ConfigEntry]:
    return parse_entries(list(raw))


TS_SHORT = gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})
TS_LONG = gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
MPS = gpu({"strategy": "MPS"})
MIG_MPS = {"apiVersion": V1, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}


@pytest.mark.parametrize(
    ("raw", "request_name", "device_type", "expected"),
    [
        ([], "gpu", "gpu", "Exclusive"),
        ([(0, "FromClaim", (), MPS), (1, "FromClass", (), TS_SHORT)], "gpu", "gpu", "MPS"),
        ([(0, "FromClaim", (), TS_SHORT), (1, "FromClaim", (), MPS)], "gpu", "gpu", "MPS"),
        ([(0, "FromClaim", ("other",), MPS)], "gpu", "gpu", "Exclusive"),
        ([(0, "FromClaim", ("gpu",), MPS)], "gpu/large", "gpu", "MPS"),
        ([(0, "FromClaim", ("gpu/small",), MPS)], "gpu/large", "gpu", "Exclusive"),
        ([(0, "FromClaim", (), MIG_MPS)], "gpu", "gpu", "Exclusive"),
        ([(0, "FromClaim", (), MIG_MPS), (1, "FromClaim", (), TS_LONG)], "gpu", "mig", "MPS"),
    ],
)
def test_merge_order(raw: Any, request_name: str, device_type: Any, expected: str) -> None:
    entry = config_for(_entries(*raw), request_name, device_type)
    assert (entry.config.sharing.strategy if entry else "Exclusive") == expected


def test_config_naming_a_request_of_another_device_type_fails() -> None:
    entries = _entries((3, "FromClaim", ("gpu",), MIG_MPS))
    with pytest.raises(ConfigError, match=r"config\[3\].opaque.parameters.kind: MigDeviceConfig"):
        config_for(entries, "gpu", "gpu")
