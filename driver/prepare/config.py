"""The versioned opaque device configuration API and its merge rules.

Users put these objects in ``opaque.parameters`` of a DeviceClass or a
ResourceClaim config entry whose ``driver`` is Tranche's. Two API groups are
accepted:

* ``gpu.tranche.dev/v1alpha1``: ``GpuConfig`` and ``MigDeviceConfig``, Tranche's own.
* ``resource.nvidia.com/v1beta1``: NVIDIA's ``GpuConfig`` and ``MigDeviceConfig``,
  mapped onto Tranche's so claims written for NVIDIA's driver keep working.

Every model rejects unknown fields and out-of-range values; a
:class:`~driver.errors.ConfigError` names the field by its path from the
claim's root (``status.allocation.devices.config[1].opaque.parameters.sharing...``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import InvalidOperation
from typing import Annotated, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from driver.errors import ConfigError
from driver.quantity import parse_quantity

API_VERSION: Final = "gpu.tranche.dev/v1alpha1"
NVIDIA_API_VERSION: Final = "resource.nvidia.com/v1beta1"
GPU_CONFIG: Final = "GpuConfig"
MIG_CONFIG: Final = "MigDeviceConfig"
MIB = 1 << 20

Strategy = Literal["Exclusive", "TimeSlicing", "MPS"]
Interval = Literal["Default", "Short", "Medium", "Long"]


def _to_bytes(value: object) -> int:
    """A Kubernetes quantity (``10Gi``, ``512Mi``, ``1e9``) as a whole number of bytes."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a quantity such as 10Gi or 512Mi")
    try:
        amount = parse_quantity(value)
    except (ValueError, InvalidOperation) as e:
        raise ValueError(f"{e}; expected a quantity such as 10Gi or 512Mi") from e
    if amount != amount.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    if amount < MIB:
        raise ValueError(f"{value!r} is below the minimum of 1Mi")
    return int(amount)


Bytes = Annotated[int, BeforeValidator(_to_bytes)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TimeSlicingConfig(_Strict):
    """How long each process runs before the GPU switches; a per-GPU setting."""

    interval: Interval = "Default"


class MpsConfig(_Strict):
    """MPS limits applied to every client of the claim's MPS server."""

    default_active_thread_percentage: int | None = Field(
        default=None, ge=1, le=100, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: Bytes | None = Field(
        default=None, alias="defaultPinnedDeviceMemoryLimit"
    )
    # Keyed by the device's position in the claim ("0", "1", ...) or by its UUID.
    default_per_device_pinned_memory_limit: dict[str, Bytes] = Field(
        default_factory=dict, alias="defaultPerDevicePinnedMemoryLimit"
    )


class Sharing(_Strict):
    """How a device is shared between the containers and pods of its claim."""

    strategy: Strategy = "Exclusive"
    time_slicing: TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")
    mps: MpsConfig | None = Field(default=None, alias="mpsConfig")

    @model_validator(mode="after")
    def _settings_match_strategy(self) -> Sharing:
        if self.time_slicing is not None and self.strategy != "TimeSlicing":
            raise ValueError("timeSlicingConfig is allowed only with strategy TimeSlicing")
        if self.mps is not None and self.strategy != "MPS":
            raise ValueError("mpsConfig is allowed only with strategy MPS")
        return self

    @property
    def interval(self) -> Interval:
        return self.time_slicing.interval if self.time_slicing else "Default"


class GpuConfig(_Strict):
    """Configuration of a whole GPU."""

    api_version: Literal["gpu.tranche.dev/v1alpha1"] = Field(
        default=API_VERSION, alias="apiVersion"
    )
    kind: Literal["GpuConfig"] = GPU_CONFIG
    sharing: Sharing = Field(default_factory=Sharing)


class MigDeviceConfig(_Strict):
    """Configuration of a MIG device; sharing applies inside the MIG device."""

    api_version: Literal["gpu.tranche.dev/v1alpha1"] = Field(
        default=API_VERSION, alias="apiVersion"
    )
    kind: Literal["MigDeviceConfig"] = MIG_CONFIG
    sharing: Sharing = Field(default_factory=Sharing)


DeviceConfig = GpuConfig | MigDeviceConfig


class _NvidiaSharing(_Strict):
    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing: TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")
    mps: MpsConfig | None = Field(default=None, alias="mpsConfig")


class _NvidiaMigSharing(_Strict):
    strategy: Literal["TimeSlicing", "MPS"]
    mps: MpsConfig | None = Field(default=None, alias="mpsConfig")


class _NvidiaGpuConfig(_Strict):
    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: _NvidiaSharing | None = None


class _NvidiaMigDeviceConfig(_Strict):
    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: _NvidiaMigSharing | None = None


def _format_error(where: str, err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"])
        field = f"{where}.{loc}" if loc else where
        parts.append(f"{field}: {item['msg']}")
    return "; ".join(parts)


def parse_device_config(parameters: object, where: str) -> DeviceConfig:
    """Validate one ``opaque.parameters`` object; ``where`` is its field path for errors."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}: must be an object with apiVersion and kind")
    api_version = parameters.get("apiVersion")
    kind = parameters.get("kind")
    if api_version not in (API_VERSION, NVIDIA_API_VERSION):
        raise ConfigError(
            f"{where}.apiVersion: {api_version!r} is not supported; "
            f"use {API_VERSION} (or NVIDIA's {NVIDIA_API_VERSION})"
        )
    if kind not in (GPU_CONFIG, MIG_CONFIG):
        raise ConfigError(
            f"{where}.kind: {kind!r} is not supported; use {GPU_CONFIG} or {MIG_CONFIG}"
        )
    try:
        if api_version == API_VERSION:
            model: type[GpuConfig | MigDeviceConfig] = (
                GpuConfig if kind == GPU_CONFIG else MigDeviceConfig
            )
            return model.model_validate(parameters)
        if kind == GPU_CONFIG:
            nv_gpu = _NvidiaGpuConfig.model_validate(parameters)
            return GpuConfig(sharing=_from_nvidia(nv_gpu.sharing))
        nv_mig = _NvidiaMigDeviceConfig.model_validate(parameters)
        return MigDeviceConfig(sharing=_from_nvidia(nv_mig.sharing))
    except ValidationError as e:
        raise ConfigError(_format_error(where, e)) from e


def _from_nvidia(sharing: _NvidiaSharing | _NvidiaMigSharing | None) -> Sharing:
    if sharing is None:
        return Sharing()
    time_slicing = getattr(sharing, "time_slicing", None)
    if sharing.strategy == "TimeSlicing":
        return Sharing(strategy="TimeSlicing", time_slicing=time_slicing or TimeSlicingConfig())
    return Sharing(strategy="MPS", mps=sharing.mps or MpsConfig())


@dataclass(frozen=True)
class ConfigEntry:
    """One validated config of the allocation, in merge order."""

    index: int  # position in status.allocation.devices.config
    source: str  # "FromClass" | "FromClaim"
    requests: tuple[str, ...]  # empty: every request
    config: DeviceConfig

    @property
    def where(self) -> str:
        """The field path of this entry's parameters, for error messages."""
        return f"status.allocation.devices.config[{self.index}].opaque.parameters"


def parse_entries(raw: Sequence[tuple[int, str, tuple[str, ...], object]]) -> list[ConfigEntry]:
    """Validate raw ``(index, source, requests, parameters)`` tuples; order: class, then claim."""
    entries = [
        ConfigEntry(
            index,
            source,
            requests,
            parse_device_config(
                params, f"status.allocation.devices.config[{index}].opaque.parameters"
            ),
        )
        for index, source, requests, params in raw
    ]
    return sorted(entries, key=lambda e: (e.source != "FromClass", e.index))


def _names_request(config_requests: tuple[str, ...], request: str) -> bool:
    base = request.split("/", 1)[0]
    return request in config_requests or base in config_requests


def config_for(
    entries: Sequence[ConfigEntry], request: str, device_type: Literal["gpu", "mig"]
) -> ConfigEntry | None:
    """The config entry that applies to one allocated device: the last match wins.

    ``None`` means no entry applies and the defaults (an exclusive device) hold.
    An entry without ``requests`` applies to every device of its own kind
    (GpuConfig to GPUs, MigDeviceConfig to MIG devices). An entry that names
    the request must be of the device's kind, or the claim fails: the user
    asked for something that cannot apply.
    """
    wanted: type[GpuConfig | MigDeviceConfig] = (
        GpuConfig if device_type == "gpu" else MigDeviceConfig
    )
    chosen: ConfigEntry | None = None
    for entry in entries:
        if entry.requests and not _names_request(entry.requests, request):
            continue
        if isinstance(entry.config, wanted):
            chosen = entry
        elif entry.requests:
            raise ConfigError(
                f"{entry.where}.kind: {entry.config.kind} cannot configure request "
                f"{request!r}, which was allocated a "
                f"{'GPU' if device_type == 'gpu' else 'MIG device'}"
            )
    return chosen
