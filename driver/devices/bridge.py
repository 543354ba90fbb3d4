"""The legacy ``nvidia.com/gpu`` resources and how Tranche serves them.

NVIDIA's device plugin advertises whole GPUs as ``nvidia.com/gpu`` and, with its
"mixed" MIG strategy, MIG devices as ``nvidia.com/mig-<profile>``
(``nvidia.com/mig-1g.10gb``). Tranche serves the same names in two ways:

* the **bridge** (Kubernetes 1.36+, KEP-5004): DeviceClasses carry
  ``spec.extendedResourceName`` and the scheduler turns such a request into a
  claim; the whole GPU maps to :data:`GPU_CLASS`, each MIG profile to its own
  class :func:`mig_class_name` (one class per extended resource name);
* the **fallback webhook** (1.34, 1.35 without the gate): the pod is rewritten
  into ResourceClaimTemplates (:func:`template_request`).

A node may not serve one name through both a device plugin and Tranche:
:func:`check_no_device_plugin` refuses to start the bridge on such a node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.errors import ConfigError, PermanentError

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_CLASS = "gpu.tranche.dev"
MIG_CLASS = "mig.gpu.tranche.dev"
DRIVER_DOMAIN = "gpu.tranche.dev"

# A MIG profile as NVIDIA names it (go-nvlib's MigProfile.String()): 1g.10gb, 1g.10gb+me,
# 1c.3g.40gb, 7g.141gb, and Blackwell's 1g.23gb+me.all (every media engine), 1g.23gb-me (none)
# and 1g.23gb+gfx.
_PROFILE = re.compile(r"^(?:[1-8]c\.)?[1-8]g\.[0-9]+gb(?:\+me|\+me\.all|\+gfx|-me)?$")
# The same profile in an extended resource name, which cannot hold "+" (NVIDIA's device plugin
# replaces it with "."): mig-1g.10gb.me, mig-1g.23gb.me.all, mig-1g.23gb-me.
_RESOURCE_PROFILE = re.compile(r"^((?:[1-8]c\.)?[1-8]g\.[0-9]+gb)(?:\.(me\.all|me|gfx)|(-me))?$")


class DevicePluginConflictError(PermanentError):
    """A device plugin on this node advertises a resource that Tranche would serve."""


@dataclass(frozen=True)
class LegacyResource:
    """What one legacy resource name asks for."""

    resource: str
    mig_profile: str | None  # None: a whole GPU

    @property
    def bridge_class(self) -> str:
        """The DeviceClass whose ``extendedResourceName`` is this resource."""
        return GPU_CLASS if self.mig_profile is None else mig_class_name(self.mig_profile)

    @property
    def short_name(self) -> str:
        """``gpu`` or ``mig-1g.10gb``: for object names (DNS subdomain safe)."""
        return "gpu" if self.mig_profile is None else "mig-" + _token(self.mig_profile)


def _token(profile: str) -> str:
    """The profile in an object name: ``+`` becomes ``-`` (``1g.10gb-me``), so Blackwell's
    ``-me`` (no media engines) becomes ``-nome`` to stay apart from it (``1g.23gb-nome``)."""
    return profile.replace("-me", "-nome").replace("+", "-")


def mig_class_name(profile: str) -> str:
    """``1g.10gb`` → ``mig-1g.10gb.gpu.tranche.dev``; ``1g.10gb+me`` → ``mig-1g.10gb-me.…``,
    ``1g.23gb+me.all`` → ``mig-1g.23gb-me.all.…``, ``1g.23gb-me`` → ``mig-1g.23gb-nome.…``."""
    return f"mig-{_token(profile)}.{DRIVER_DOMAIN}"


def mig_resource_name(profile: str) -> str:
    """``1g.10gb+me`` → ``nvidia.com/mig-1g.10gb.me``: a resource name cannot hold ``+``
    (the API server refuses the DeviceClass), so, as NVIDIA's device plugin names it, the
    extension follows a dot (``mig-1g.23gb.me.all``); ``-me`` stays (``mig-1g.23gb-me``)."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def parse_legacy(resource: str) -> LegacyResource | None:
    """The legacy resource ``resource`` names, or None when it is not one of them."""
    if resource == GPU_RESOURCE:
        return LegacyResource(resource, None)
    if resource.startswith(MIG_RESOURCE_PREFIX):
        found = _RESOURCE_PROFILE.match(resource[len(MIG_RESOURCE_PREFIX) :])
        if found:
            base, extension, without = found.groups()
            suffix = f"+{extension}" if extension else (without or "")
            return LegacyResource(resource, base + suffix)
    return None


def is_legacy(resource: str) -> bool:
    return parse_legacy(resource) is not None


def bridge_device_class(profile: str | None) -> dict[str, Any]:
    """The bridge DeviceClass for a whole GPU (``None``) or one MIG profile."""
    legacy = LegacyResource(
        GPU_RESOURCE if profile is None else mig_resource_name(profile), profile
    )
    if profile is not None and not _PROFILE.match(profile):
        raise ConfigError(f"MIG profile {profile!r} is not a profile name like 1g.10gb")
    attrs = f'device.attributes["{DRIVER_DOMAIN}"]'
    if profile is None:
        expression = (
            f'device.driver == "{DRIVER_DOMAIN}" && {attrs}.type == "gpu" && '
            f'!("sharing" in {attrs}) && !("dedicatedTo" in {attrs})'
        )
    else:
        expression = (
            f'device.driver == "{DRIVER_DOMAIN}" && {attrs}.type == "mig" && '
            f'{attrs}.profile == "{profile}" && !("dedicatedTo" in {attrs})'
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {
            "name": legacy.bridge_class,
            "labels": {
                "app.kubernetes.io/part-of": "tranche",
                "gpu.tranche.dev/mechanism": "gpu" if profile is None else "mig",
            },
        },
        "spec": {
            "selectors": [{"cel": {"expression": expression}}],
            "extendedResourceName": legacy.resource,
        },
    }


def template_request(legacy: LegacyResource, count: int) -> dict[str, Any]:
    """The claim request the fallback webhook writes for ``count`` of ``legacy``.

    Whole GPUs use the class ``gpu.tranche.dev``; MIG devices use
    ``mig.gpu.tranche.dev`` with a profile selector, so the trust policy sees
    the mechanism it knows.
    """
    exactly: dict[str, Any] = {"allocationMode": "ExactCount", "count": count}
    if legacy.mig_profile is None:
        exactly["deviceClassName"] = GPU_CLASS
    else:
        exactly["deviceClassName"] = MIG_CLASS
        exactly["selectors"] = [
            {
                "cel": {
                    "expression": f'device.attributes["{DRIVER_DOMAIN}"].profile == '
                    f'"{legacy.mig_profile}"'
                }
            }
        ]
    return {"name": "gpu", "exactly": exactly}


def _nonzero(quantity: object) -> bool:
    """A Kubernetes quantity other than zero (``0``, ``0.0``, ``0k``, ``0Ki``)."""
    return not re.fullmatch(r"\+?0*\.?0*[a-zA-Z]*", str(quantity).strip())


def _mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is an object, else empty: a field of another shape (an answer that
    is no Node) advertises nothing."""
    return value if isinstance(value, Mapping) else {}


def check_no_device_plugin(node: Mapping[str, Any], resources: Iterable[str] | None = None) -> None:
    """Refuse to serve legacy names on a node where a device plugin advertises them.

    ``node`` is the Node object as JSON. ``resources`` are the names the bridge
    serves; None means ``nvidia.com/gpu`` and every ``nvidia.com/mig-*`` name.
    Raises :class:`DevicePluginConflictError` naming the node, the resource, the
    field and the quantity.
    """
    name = str(_mapping(node.get("metadata")).get("name", "<unnamed>"))
    status = _mapping(node.get("status"))
    wanted = set(resources) if resources is not None else None
    found: list[str] = []
    for field in ("allocatable", "capacity"):
        for resource, quantity in sorted(_mapping(status.get(field)).items()):
            served = is_legacy(resource) if wanted is None else resource in wanted
            if served and _nonzero(quantity):
                found.append(f"status.{field}[{resource}]={quantity}")
    if found:
        raise DevicePluginConflictError(
            f"node {name}: a device plugin advertises {', '.join(found)}; the extended-resource "
            "bridge cannot serve the same resource on the same node. Remove the NVIDIA device "
            "plugin from this node (or label the node so its DaemonSet skips it) before "
            "starting Tranche's plugin there; both would hand out the same GPUs, with or "
            "without the bridge. Only while migrating: --no-device-plugin-check (chart "
            "kubeletPlugin.devicePluginCheck=false)"
        )
