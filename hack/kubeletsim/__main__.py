"""``python -m hack.kubeletsim``: run the kubelet stand-in for one node and print its calls."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.kubeletsim", description=__doc__)
    parser.add_argument(
        "--node-name",
        default=os.environ.get("KUBELETSIM_NODE_NAME", ""),
        help="node this kubelet plays (env KUBELETSIM_NODE_NAME)",
    )
    parser.add_argument(
        "--kubelet-root",
        default=os.environ.get("KUBELETSIM_KUBELET_ROOT", "/var/lib/kubelet"),
        help="kubelet root directory holding plugins_registry/ (env KUBELETSIM_KUBELET_ROOT)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG", ""),
        help="kubeconfig of the cluster; empty: no API server, registration and health only "
        "(env KUBECONFIG)",
    )
    parser.add_argument(
        "--version-style",
        default=os.environ.get("KUBELETSIM_VERSION_STYLE", "1.37"),
        choices=["1.33", "1.34", "1.37"],
        help="which kubelet release to play (env KUBELETSIM_VERSION_STYLE)",
    )
    options = parser.parse_args(argv)
    if not options.node_name:
        parser.error("--node-name (or KUBELETSIM_NODE_NAME) is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from hack.kubeletsim.simulator import KubeletSimulator  # noqa: PLC0415

    api = None
    if options.kubeconfig:
        from driver.kube.client import api_client  # noqa: PLC0415

        api = api_client(options.kubeconfig)
    sim = KubeletSimulator(
        options.node_name, options.kubelet_root, api, version_style=options.version_style
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    sim.start()
    done.wait()
    sim.stop()
    for call in sim.calls:
        print(
            f"{call.method} driver={call.driver} request={','.join(call.request)} "
            f"answer={call.answer} error={call.error}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
