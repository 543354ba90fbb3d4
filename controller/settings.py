"""Settings of ``tranche controller``: parsed once at start, validated, frozen.

Every flag has a ``TRANCHE_*`` environment twin (see :mod:`driver.flags`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from driver.devices.slices import DEFAULT_DRIVER_NAME
from driver.errors import ConfigError
from driver.flags import add_flag, add_switch, invalid_setting, named, number, parse_address

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# An object name: a DNS subdomain (RFC 1123), at most 253 characters.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _default_namespace() -> str:
    try:
        return _SA_NAMESPACE.read_text().strip() or "tranche"
    except OSError:
        return "tranche"


class ControllerSettings(BaseModel):
    """Validated configuration of one controller replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kubeconfig: str | None = None
    driver_name: str = Field(default=DEFAULT_DRIVER_NAME, min_length=1, max_length=63)
    namespace: str = Field(min_length=1, max_length=63)
    identity: str = Field(min_length=1, max_length=253)
    lease_name: str = "tranche-controller"
    legacy_webhook: bool = False
    webhook_address: str = ":8443"
    webhook_config: str = "tranche-legacy-gpu"
    webhook_service: str = "tranche-controller"
    webhook_ip_sans: tuple[str, ...] = ()
    tls_secret: str = "tranche-webhook-tls"  # noqa: S105 (the Secret's name)
    cert_validity_days: int = Field(default=90, ge=1, le=3650)
    ca_validity_days: int = Field(default=1825, ge=2, le=36500)
    slice_gc_interval_s: float = Field(default=60.0, ge=0, le=86400)  # 0 off, else at least 1
    # At least a second: a pass reads the API server, and a tiny interval would be a busy loop.
    sync_interval_s: float = Field(default=10.0, ge=1, le=3600)
    health_address: str = ":8081"
    metrics_address: str = ":9090"
    log_level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")

    @field_validator("webhook_address", "health_address", "metrics_address")
    @classmethod
    def _address(cls, v: str, info: ValidationInfo) -> str:
        if v:
            parse_address(v, named("--" + str(info.field_name).replace("_", "-")))
        return v

    @field_validator("slice_gc_interval_s")
    @classmethod
    def _gc_interval(cls, v: float) -> float:
        if 0 < v < 1:
            raise ValueError(
                f"{named('--slice-gc-interval')}: {v:g} is neither 0 (off) nor at least 1 second"
            )
        return v

    @field_validator("lease_name", "webhook_config", "webhook_service", "tls_secret", "driver_name")
    @classmethod
    def _object_name(cls, v: str, info: ValidationInfo) -> str:
        if len(v) > 253 or not _DNS_SUBDOMAIN.fullmatch(v):
            flag = "--" + str(info.field_name).replace("_", "-")
            raise ValueError(
                f"{named(flag)}: {v!r} is not an object name (a DNS subdomain: "
                "lowercase letters, digits, '-' and '.', at most 253 characters)"
            )
        return v

    @field_validator("webhook_ip_sans")
    @classmethod
    def _ips(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for ip in v:
            ipaddress.ip_address(ip)
        return v

    @property
    def webhook_dns_names(self) -> tuple[str, ...]:
        svc, ns = self.webhook_service, self.namespace
        return (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(
        p,
        "--kubeconfig",
        "kubeconfig file (default: in-cluster service account, else KUBECONFIG or ~/.kube/config)",
    )
    add_flag(p, "--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME)
    add_flag(p, "--namespace", "namespace of the lease and the TLS secret "
             "(default: the pod's own namespace)")  # fmt: skip
    add_flag(p, "--identity", "leader-election identity (default: the host name)")
    add_flag(p, "--lease-name", "Lease used for leader election", default="tranche-controller")
    add_switch(p, "--legacy-webhook", "serve the webhook that rewrites nvidia.com/gpu pods into "
               "claims (for clusters without the extended-resource bridge)")  # fmt: skip
    add_flag(p, "--webhook-address", "HOST:PORT of the HTTPS webhook", default=":8443")
    add_flag(p, "--webhook-config", "MutatingWebhookConfiguration whose caBundle is kept "
             "current", default="tranche-legacy-gpu")  # fmt: skip
    add_flag(p, "--webhook-service", "Service in front of the webhook (certificate names)",
             default="tranche-controller")  # fmt: skip
    add_flag(p, "--webhook-ip-sans", "comma-separated IP addresses for the certificate", default="")
    add_flag(p, "--tls-secret", "Secret holding the webhook CA and certificate",
             default="tranche-webhook-tls")  # fmt: skip
    add_flag(p, "--cert-validity-days", "lifetime of the serving certificate", default="90")
    add_flag(p, "--ca-validity-days", "lifetime of the webhook CA", default="1825")
    add_flag(p, "--slice-gc-interval", "seconds between clean-ups of slices whose node is "
             "gone (at least 1); 0 disables", default="60")  # fmt: skip
    add_flag(p, "--sync-interval", "seconds between certificate checks (1 to 3600)", default="10")
    add_flag(p, "--health-address", "HOST:PORT of /healthz and /readyz; empty disables",
             default=":8081")  # fmt: skip
    add_flag(p, "--metrics-address", "HOST:PORT of /metrics; empty disables", default=":9090")
    add_flag(p, "--log-level", "log level", default="INFO", choices=LOG_LEVELS)


def _ips(value: str) -> tuple[str, ...]:
    """``--webhook-ip-sans``: comma-separated IP addresses; a ConfigError naming the flag."""
    ips = tuple(s.strip() for s in value.split(",") if s.strip())
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            flag = named("--webhook-ip-sans")
            raise ConfigError(f"{flag}: {ip!r} is not an IP address") from None
    return ips


def settings_from_args(args: argparse.Namespace) -> ControllerSettings:
    """Validate once; a bad value raises :class:`ConfigError` naming the setting."""
    try:
        return ControllerSettings(
            kubeconfig=args.kubeconfig or None,
            driver_name=args.driver_name,
            namespace=args.namespace or _default_namespace(),
            identity=args.identity or os.environ.get("POD_NAME") or socket.gethostname(),
            lease_name=args.lease_name,
            legacy_webhook=args.legacy_webhook,
            webhook_address=args.webhook_address,
            webhook_config=args.webhook_config,
            webhook_service=args.webhook_service,
            webhook_ip_sans=_ips(args.webhook_ip_sans),
            tls_secret=args.tls_secret,
            cert_validity_days=number(args.cert_validity_days, "--cert-validity-days", int),
            ca_validity_days=number(args.ca_validity_days, "--ca-validity-days", int),
            slice_gc_interval_s=number(args.slice_gc_interval, "--slice-gc-interval", float),
            sync_interval_s=number(args.sync_interval, "--sync-interval", float),
            health_address=args.health_address,
            metrics_address=args.metrics_address,
            log_level=args.log_level,
        )
    except ValidationError as e:
        raise invalid_setting(e, args) from e
    except (ValueError, ConfigError) as e:
        raise ConfigError(f"invalid setting: {e}") from e
