"""``tranche cluster-devices`` over a claim list holding a claim whose JSON nests too deep:
the claim is reported on stderr and the devices are listed."""

from __future__ import annotations

import argparse

import pytest
from kubernetes import client

from controller.devices import cluster


def test_cluster_devices_reports_the_unreadable_claim_and_lists_the_devices(
    canned_api: client.ApiClient, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    cluster.add_arguments(parser, env={})
    args = parser.parse_args([])
    assert cluster.run(args) == 0
    out, err = capsys.readouterr()
    assert "tranche cluster-devices: ResourceClaim b/deep: spec.devices.config[0]" in err
    row = next(line for line in out.splitlines() if "gpu-aaaa-ts-blue" in line)
    assert "a/good" in row and "b/deep" in row
