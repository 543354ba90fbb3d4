"""The kubelet plugin process stays lean: it never imports the generated kubernetes client
(about 44 MiB resident), which would put its idle RSS over the 100 MB target."""

from __future__ import annotations

import ast
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


def _loaded_by_dry_run(packages: tuple[str, ...], *flags: str) -> list[str]:
    """The modules of ``packages`` that ``tranche kubelet-plugin --dry-run FLAGS`` imports."""
    check = (
        "import sys; from driver.cli import main; "
        f"sys.argv = ['tranche', 'kubelet-plugin', '--node-name', 'n', '--dry-run', *{flags!r}]; "
        "assert main() == 0; "
        f"print(repr(sorted(m for m in sys.modules if m.split('.')[0] in {packages!r})[:5]))"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    loaded: list[str] = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    return loaded


def test_tranche_kubelet_plugin_loads_no_other_command() -> None:
    """``tranche kubelet-plugin`` loads only its own entry point: the controller's commands
    import the kubernetes client and cel-python (about 0.4 s and 25 MiB at every start)."""
    assert _loaded_by_dry_run(("kubernetes", "controller", "celpy")) == []


def test_tranche_help_still_lists_every_command() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "driver.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    for name in ("kubelet-plugin", "controller", "devices", "taint", "explain"):
        assert name in run.stdout


def test_settings_as_the_chart_renders_them_load_no_yaml_parser() -> None:
    """The chart renders structured settings as JSON and a pod has no kubeconfig, so an
    installed plugin never imports PyYAML (about 1 MiB resident, docs/performance.md); nor
    difflib, which only names close devices in an error."""
    chart_flags = (
        "--sharing", '{"groups": ["blue"], "maxShares": 4}',
        "--advertise", '{"*": ["gpu", "mig"]}',
        "--health-policy", '{"quiet_seconds": 60}',
    )  # fmt: skip
    assert _loaded_by_dry_run(("yaml", "_yaml", "difflib"), *chart_flags) == []
