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
from fractions import Fraction
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from controller.kube_client import add_kubeconfig_flag
from controller.report.advice import Recommendations, recommendations
from controller.report.advice import render_json as advice_json
from controller.report.advice import render_text as advice_text
from controller.report.catalog import DeviceInfo, read_catalog
from controller.report.chart import render_svg
from controller.report.cost import IDLE_POLICIES, CostReport, IdlePolicy, allocate
from controller.report.data import Report, report_from_snapshots
from controller.report.html import render_html
from controller.report.owners import Cluster, read_cluster
from controller.report.prices import Prices, load_prices
from controller.report.prometheus import query_prometheus
from controller.report.recommend import DEFAULT_MIN_SAMPLES
from controller.report.render import RENDERERS, reconciliation
from controller.report.sources import (
    BaselineFile,
    choose_chain,
    http_get,
    query_claim_series,
    scrape,
)
from driver.cli import Command
from driver.errors import ConfigError, TrancheError
from driver.flags import add_flag, add_switch, env_name
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


# A plugin's /metrics answers at once; a Prometheus query over a fleet's month reads every
# sample (docs/performance.md, Showback: 10-17 s at 500 nodes scraped every 15 minutes), and
# Prometheus's own query timeout defaults to 2 minutes.
SCRAPE_TIMEOUT_S = 10.0
PROMETHEUS_TIMEOUT_S = 120.0


def _timeout(text: str, *, prometheus: bool) -> float:
    if not text.strip():
        return PROMETHEUS_TIMEOUT_S if prometheus else SCRAPE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"--timeout: {text!r} is not a number of seconds above 0")
    return value


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
    timeout_s: float = Field(default=SCRAPE_TIMEOUT_S, gt=0)
    prices: Path | None = None
    idle_policy: IdlePolicy = "proportional"
    html: Path | None = None
    kubeconfig: str | None = None
    recommend: bool = False
    headroom: float = Field(default=0.2, ge=0, le=10)
    min_samples: int = Field(default=DEFAULT_MIN_SAMPLES, ge=1)

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
    add_flag(
        parser,
        "--timeout",
        f"HTTP timeout per request, seconds (with --prometheus also the query timeout asked "
        f"of the server). Default {SCRAPE_TIMEOUT_S:.0f} for --metrics-url, "
        f"{PROMETHEUS_TIMEOUT_S:.0f} for --prometheus.",
        default="",
        env=env,
    )
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
    add_switch(
        parser,
        "--recommend",
        "Instead of the usage table: per workload (Deployment, Job, StatefulSet, PodGroup, "
        "else pod or claim) the peak and p95 of measured SM use and memory, the smallest "
        "device kind that would have fit with --headroom, and the GPU-hours (and with --prices "
        "the cost) it would have saved. Needs --prometheus for history and the cluster "
        "(--kubeconfig) for owners and devices.",
        env=env,
    )
    add_flag(
        parser,
        "--headroom",
        "With --recommend: room kept above the peak, a fraction (0.2) or a percentage (20%%).",
        default="0.2",
        env=env,
    )
    add_flag(
        parser,
        "--min-samples",
        "With --recommend: fewer samples than this in the window is too little data.",
        default=str(DEFAULT_MIN_SAMPLES),
        env=env,
    )
    add_kubeconfig_flag(parser, env)


def parse_headroom(text: str) -> float:
    """``20%`` or ``0.2`` → 0.2."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError as err:
        raise ConfigError(f"--headroom: {text!r} is not a percentage such as 20% or 0.2") from err
    if not 0 <= value <= 10:  # NaN fails too
        raise ConfigError(f"--headroom: {text!r} is not between 0% and 1000%")
    return value


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
    recommend = bool(getattr(args, "recommend", False))
    headroom = parse_headroom(getattr(args, "headroom", "20%"))
    raw_min = str(getattr(args, "min_samples", DEFAULT_MIN_SAMPLES))
    if not raw_min.strip().isdigit() or int(raw_min) < 1:
        raise ConfigError(f"--min-samples: {raw_min!r} is not a whole number of at least 1")
    if recommend and (args.output == "csv" or args.chart or args.html):
        raise ConfigError("--recommend prints a table or JSON: no --output csv, --chart or --html")
    try:
        return ReportSettings(
            since_s=since,
            metrics_urls=urls,
            prometheus=args.prometheus,
            baseline=Path(args.baseline) if args.baseline else None,
            interval_s=interval,
            output=args.output,
            chart=Path(args.chart) if args.chart else None,
            timeout_s=_timeout(str(args.timeout or ""), prometheus=bool(args.prometheus)),
            prices=Path(args.prices) if args.prices else None,
            idle_policy=args.idle_policy,
            html=Path(args.html) if args.html else None,
            kubeconfig=args.kubeconfig,
            recommend=recommend,
            headroom=headroom,
            min_samples=int(raw_min),
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


ClusterReader = Callable[[ReportSettings], Cluster]


def cluster_objects(settings: ReportSettings) -> Cluster:
    """Claims, pods, ReplicaSets, namespaces and slices for ``--recommend``."""
    return read_cluster(api_client(settings.kubeconfig))


def recommend_report(
    settings: ReportSettings,
    report: Report,
    prices: Prices | None,
    cluster: ClusterReader,
    get: Callable[[str, float], bytes] = http_get,
) -> Recommendations:
    """The right-sizing advice for the report's claims."""
    if settings.prometheus is not None:
        start = report.start if report.start is not None else report.end - settings.since_s
        series, step = query_claim_series(
            settings.prometheus, start, report.end, settings.timeout_s, get
        )
        notes = (
            f"SM use and memory: Prometheus rate() per {step}s step, peak and p95 of the steps "
            "in which a claim held its device",
        )
        found = series
    else:
        found = None
        notes = (
            "plugin metrics endpoints keep counters, not history: no peak can be measured; "
            "use --prometheus",
        )
    log.info(
        "recommend: reading the cluster",
        extra={"claims": len(report.claims), "history": found is not None},
    )
    return recommendations(
        report,
        found,
        cluster(settings),
        headroom=Fraction(str(settings.headroom)),
        min_samples=settings.min_samples,
        prices=prices,
        notes=notes,
    )


def run(
    args: argparse.Namespace,
    catalog: Catalog = cluster_catalog,
    clock: Callable[[], float] = time.time,
    cluster: ClusterReader = cluster_objects,
) -> int:
    advice: Recommendations | None = None
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
        if settings.recommend:
            advice = recommend_report(settings, report, prices, cluster)
            cost = None
        else:
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
    if advice is not None:
        sys.stdout.write(advice_json(advice) if settings.output == "json" else advice_text(advice))
        return 0
    sys.stdout.write(RENDERERS[settings.output](report, cost))
    return 0


command = Command(
    help="GPU showback: allocated, measured and idle GPU-hours per namespace and tenant.",
    add_arguments=add_arguments,
    run=run,
)
