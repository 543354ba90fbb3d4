"""Shared test configuration.

With ``CI=true`` (set by ``.ci/run``) a test that needs the real control plane
must never be skipped: ``unavailable()`` fails instead of skipping, and any
skip of a ``cluster``-marked test is turned into a failure as a backstop.
Tests that use the ``cluster`` fixture are marked ``cluster`` automatically.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import NoReturn

import pytest

# Fixtures that run the real kubelet plugin on simulated nodes, install the trust
# admission policy, and run real nodes (kubelet + containerd); they need the cluster fixtures.
pytest_plugins = ["tests.e2e.sim_nodes", "tests.e2e.trust_policy", "tests.e2e.real_nodes"]

CLUSTER_FIXTURES = frozenset(
    {"cluster", "namespace", "make_node", "k8s_bin_dir", "real_node", "node_bin_dir"}
)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str, what: str = "the control plane") -> NoReturn:
    """Skip with ``reason`` locally; fail with it under ``CI=true``, saying ``what`` is missing."""
    if in_ci():
        pytest.fail(f"CI=true and {what} is unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def _minor(text: str) -> tuple[int, int]:
    major, minor = text.strip().lstrip("v").split(".")[:2]
    return int(major), int(minor)


_DESELECTED = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    version = os.environ.get("TRANCHE_K8S_VERSION") or "1.37"
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    reasons: list[str] = []
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
        need = item.get_closest_marker("k8s")
        if need is not None and _minor(version) < _minor(str(need.kwargs["min"])):
            dropped.append(item)
            why = need.kwargs.get("reason", "")
            reasons.append(f"{item.nodeid}: needs Kubernetes >= {need.kwargs['min']} {why}".strip())
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
        config.stash[_DESELECTED] = reasons


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    reasons = config.stash.get(_DESELECTED, [])
    if reasons:
        version = os.environ.get("TRANCHE_K8S_VERSION") or "1.37"
        terminalreporter.section(f"not run on Kubernetes {version}")
        for line in reasons:
            terminalreporter.line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (
        in_ci()
        and report.skipped
        and item.get_closest_marker("cluster") is not None
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"CI=true forbids skipping a cluster test; it was skipped: {reason}"
    return report
