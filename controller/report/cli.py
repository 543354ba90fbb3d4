"""``tranche report``: GPU showback per namespace and tenant.

Reads the plugins' metrics endpoints (``--metrics-url``, repeated) or a
Prometheus server (``--prometheus``) and prints allocated, measured and idle
GPU-hours over the last ``--since``. With ``--prices`` it adds what they cost
(devices' products from the cluster's ResourceSlices, ``--kubeconfig``), split
by ``--idle-policy``; ``--html`` writes a showback page. See ``docs/metrics.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from controller.kube_client import add_kubeconfig_flag
from controller.report.catalog import DeviceInfo, read_catalog
from controller.report.chart import render_svg
from controller.report.cost import IDLE_POLICIES, CostReport, IdlePolicy, allocate
from controller.report.data import Report, report_from_snapshots
from controller.report.html import render_html
from controller.report.prices import Prices, load_prices
from controller.report.render import RENDERERS, reconciliation
from controller.report.sources import (
    BaselineFile,
    choose_chain,
    http_get,
    query_prometheus,
    scrape,
)
from driver.cli import Command
from driver.errors import ConfigError, TrancheError
from driver.flags import add_flag, env_name
from driver.kube.client import api_client

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``24h``, ``7d`` → seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration such as 30m, 24h or 7d")
    return float(match.group(1)) * _UNITS[match.group(2)]


class ReportSettings(BaseModel):
    """The validated flags of ``tranche report``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    since_s: float = Field(gt=0)
    metrics_urls: tuple[str, ...] = ()
    prometheus: str | None = None
    baseline: Path | None = None
    interval_s: float | None = Field(default=None, gt=0)
    output: Literal["table", "csv", "json"] = "table"
    chart: Path | None = None
    timeout_s: float = Field(default=10.0, gt=0)
    prices: Path | None = None
    idle_policy: IdlePolicy = "proportional"
    html: Path | None = None
    kubeconfig: str | None = None

    @field_validator("metrics_urls")
    @classmethod
    def _http_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return urls

    @field_validator("prometheus")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    environ = os.environ if env is None else env
    add_flag(parser, "--since", "Report window, e.g. 30m, 24h, 7d.", default="24h", env=env)
    urls_env = env_name("--metrics-url")
    parser.add_argument(
        "--metrics-url",
        action="append",
        default=None,
        help="A kubelet plugin's metrics endpoint (http://node:port/metrics); repeat for every "
        f"node. [env {urls_env}, comma-separated]",
    )
    parser.set_defaults(
        _metrics_url_env=[u for u in environ.get(urls_env, "").split(",") if u.strip()]
    )
    add_flag(parser, "--prometheus", "Prometheus server URL (instead of --metrics-url).", env=env)
    add_flag(
        parser,
        "--baseline",
        "File of earlier scrapes: the report covers the increase since the scrape nearest "
        "--since ago, and this run's scrape is appended.",
        env=env,
    )
    add_flag(
        parser,
        "--interval",
        "Without --baseline: scrape twice this far apart (e.g. 60s) and report the increase.",
        env=env,
    )
    add_flag(
        parser,
        "--output",
        "Output format.",
        default="table",
        choices=("table", "csv", "json"),
        env=env,
    )
    add_flag(parser, "--chart", "Also write an SVG chart of GPU-hours per tenant here.", env=env)
    add_flag(parser, "--timeout", "HTTP timeout per request, seconds.", default="10", env=env)
    add_flag(
        parser,
        "--prices",
        "YAML price file (currency; price per GPU-hour by product name, MIG profiles by "
        "memory slices or explicitly): adds cost columns. Products come from the cluster's "
        "ResourceSlices (--kubeconfig).",
        env=env,
    )
    add_flag(
        parser,
        "--idle-policy",
        "Who pays for held GPU time no claim kept busy: proportional (the tenants, by "
        "allocation), owner (the platform line) or none (not charged).",
        default="proportional",
        choices=IDLE_POLICIES,
        env=env,
    )
    add_flag(parser, "--html", "Also write a self-contained showback page (HTML) here.", env=env)
    add_kubeconfig_flag(parser, env)


def settings_from(args: argparse.Namespace) -> ReportSettings:
    try:
        since = parse_duration(args.since)
        interval = parse_duration(args.interval) if args.interval else None
    except ValueError as err:
        raise ConfigError(f"--since/--interval: {err}") from err
    urls = tuple(u.strip() for u in (args.metrics_url or args._metrics_url_env))
    if bool(urls) == bool(args.prometheus):
        raise ConfigError("give either --metrics-url (repeatable) or --prometheus, not both")
    if args.prometheus and (args.baseline or args.interval):
        raise ConfigError("--baseline and --interval apply to --metrics-url, not --prometheus")
    try:
        return ReportSettings(
            since_s=since,
            metrics_urls=urls,
            prometheus=args.prometheus,
            baseline=Path(args.baseline) if args.baseline else None,
            interval_s=interval,
            output=args.output,
            chart=Path(args.chart) if args.chart else None,
            timeout_s=float(args.timeout),
            prices=Path(args.prices) if args.prices else None,
            idle_policy=args.idle_policy,
            html=Path(args.html) if args.html else None,
            kubeconfig=args.kubeconfig,
        )
    except (ValidationError, ValueError) as err:
        raise ConfigError(f"tranche report flags: {err}") from err


def build_report(
    settings: ReportSettings,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Report:
    """Read the sources and build the report (appending to the baseline file if given)."""
    if settings.prometheus is not None:
        end = clock()
        return query_prometheus(
            settings.prometheus, end - settings.since_s, end, settings.timeout_s, http_get
        )
    source = "metrics " + ", ".join(settings.metrics_urls)
    first = scrape(settings.metrics_urls, settings.timeout_s, clock())
    if settings.baseline is not None:
        store = BaselineFile(settings.baseline)
        history = store.load()
        chain, complete = choose_chain(history, first.time - settings.since_s)
        notes = []
        if not history:
            notes.append(
                f"{settings.baseline} had no earlier scrape: totals since the plugins started"
            )
        elif not complete:
            notes.append(f"{settings.baseline} does not reach back --since; window is shorter")
        store.append(first)
        return report_from_snapshots([*chain, first], source, notes)
    if settings.interval_s is not None:
        sleep(settings.interval_s)
        second = scrape(settings.metrics_urls, settings.timeout_s, clock())
        return report_from_snapshots([first, second], source, [])
    return report_from_snapshots(
        [first], source, ["no --baseline or --interval: totals since the plugins started"]
    )


class EmptyWindow(TrancheError):
    """The sources returned no usage series at all: a report of zeros would be wrong."""


Catalog = Callable[[ReportSettings], Mapping[str, DeviceInfo]]


def cluster_catalog(settings: ReportSettings) -> Mapping[str, DeviceInfo]:
    """The devices' products from the cluster's ResourceSlices and claim statuses."""
    return read_catalog(api_client(settings.kubeconfig))


def check_report(report: Report) -> list[str]:
    """Refuse a window with no data; warnings (returned) for what the reader must know."""
    if report.series == 0:
        raise EmptyWindow(
            f"{report.source} returned no Tranche usage series for the window: nothing was "
            "ever prepared there, or the source does not scrape the plugins. No report."
        )
    warnings = []
    for namespace, tenants in report.tenant_changes().items():
        warnings.append(
            f"namespace {namespace} changed tenant inside the window ({', '.join(tenants)}): "
            "each claim's usage stays with the tenant it was prepared under, so the namespace "
            "appears under each"
        )
    if report.start is not None and report.end <= report.start:
        raise EmptyWindow("the window is empty (its start is its end): no report")
    return warnings


def price_report(
    settings: ReportSettings, prices: Prices, report: Report, catalog: Catalog
) -> CostReport:
    cost = allocate(report, catalog(settings), prices, settings.idle_policy)
    if not cost.reconciles():  # by construction it does; a bill that does not is never printed
        raise TrancheError(f"internal error: the cost does not reconcile: {reconciliation(cost)}")
    return cost


def run(
    args: argparse.Namespace,
    catalog: Catalog = cluster_catalog,
    clock: Callable[[], float] = time.time,
) -> int:
    try:
        settings = settings_from(args)
        prices = load_prices(settings.prices) if settings.prices is not None else None
        report = build_report(settings, clock=clock)
        if settings.chart is not None and report.start is None:
            raise ConfigError("--chart needs a window: use --baseline, --interval or --prometheus")
        warnings = check_report(report)
        for warning in warnings:
            print(f"tranche report: warning: {warning}", file=sys.stderr)
        report = replace(report, notes=(*report.notes, *warnings))
        cost = price_report(settings, prices, report, catalog) if prices is not None else None
        if settings.chart is not None:
            settings.chart.write_text(render_svg(report), encoding="utf-8")
        if settings.html is not None:
            settings.html.write_text(render_html(report, cost), encoding="utf-8")
    except ConfigError as err:
        print(f"tranche report: {err}", file=sys.stderr)
        return 2
    except TrancheError as err:
        print(f"tranche report: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"tranche report: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return 1
    sys.stdout.write(RENDERERS[settings.output](report, cost))
    return 0


command = Command(
    help="GPU showback: allocated, measured and idle GPU-hours per namespace and tenant.",
    add_arguments=add_arguments,
    run=run,
)
