"""The error tree of Tranche.

::

    TrancheError
    ├── PermanentError          retrying the same input cannot succeed
    │   ├── ConfigError         a malformed opaque config or bad flag value
    │   ├── ClaimError          a claim this node cannot prepare (wrong node, unknown device, ...)
    │   ├── TrustViolation      co-location that tenant trust levels forbid
    │   └── DeviceNotFound      a device name or UUID that does not exist
    ├── RetryableError          may succeed later (API server down, GPU busy)
    │   └── ApiUnavailable
    ├── CheckpointError         a checkpoint file that cannot be trusted
    └── NvmlError               an NVML call failed; carries the NVML return code

Every error names the object and the field it is about where there is one,
so a user reading a claim's error knows what to fix.
"""

from __future__ import annotations


class TrancheError(Exception):
    """Base of every error Tranche raises on purpose."""


class PermanentError(TrancheError):
    """Retrying with the same input cannot succeed."""


class RetryableError(TrancheError):
    """The operation may succeed when retried later."""


class ConfigError(PermanentError):
    """A configuration value is invalid; the message names the field."""


class ClaimError(PermanentError):
    """A ResourceClaim cannot be prepared on this node as allocated."""


class TrustViolation(PermanentError):
    """Tenant trust levels forbid the requested co-location."""


class DeviceNotFound(PermanentError):
    """A device name or UUID does not exist; ``matches`` lists close names."""

    def __init__(self, message: str, matches: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.matches = matches


class ApiUnavailable(RetryableError):
    """The Kubernetes API server could not be reached."""


class CheckpointError(TrancheError):
    """A checkpoint file is corrupt, from another boot, or of an unknown version."""


class NvmlError(TrancheError):
    """An NVML call failed. ``code`` is the NVML return code (``NVML_ERROR_*``)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# Bounded label values for metrics: every error maps to one of these.
ERROR_REASONS = (
    "config",
    "claim",
    "trust",
    "device-not-found",
    "api-unavailable",
    "checkpoint",
    "nvml",
    "publish",
    "claim-status",
    "event",
    "device-plugin-conflict",
    "deadline",
    "internal",
)

_ERROR_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (ConfigError, "config"),
    (TrustViolation, "trust"),
    (DeviceNotFound, "device-not-found"),
    (ClaimError, "claim"),
    (ApiUnavailable, "api-unavailable"),
    (CheckpointError, "checkpoint"),
    (NvmlError, "nvml"),
)


def error_reason(err: BaseException) -> str:
    """The bounded ``reason`` label for an error."""
    for cls, reason in _ERROR_CLASSES:
        if isinstance(err, cls):
            return reason
    return "internal"
