"""The kubelet plugin process stays lean: it never imports the generated kubernetes client
(about 44 MiB resident), which would put its idle RSS over the 100 MB target."""

from __future__ import annotations

import subprocess
import sys

CHECK = (
    "import kubelet_plugin.main, sys; "
    "loaded = sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')); "
    "print(loaded[:5]); "
    "assert not loaded"
)


def test_the_plugin_command_does_not_import_the_kubernetes_client() -> None:
    run = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "[]"


def test_a_real_node_plugin_does_not_load_the_simulated_nvml() -> None:
    check = (
        "import kubelet_plugin.main, sys; "
        "loaded = sorted(m for m in sys.modules if m.startswith('driver.nvml.sim')); "
        "print(loaded[:5])"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
