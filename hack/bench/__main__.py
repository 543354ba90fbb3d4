"""``python -m hack.bench [--only NAME ...] [--doc PATH | --no-doc]``: run the benchmarks.

Prints a table per scenario and rewrites the scenario's block in
``docs/performance.md``. Scenarios that need the control plane share one
(started once, stopped at the end). Exit code 1 when a scenario failed to run;
a missed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import traceback
from pathlib import Path
from types import ModuleType

from hack.bench import (
    attribution,
    calibration,
    discovery,
    explain,
    fleet,
    health,
    installed,
    modes,
    prepare,
    realnode,
    regression,
    report,
    scale,
    showback,
)
from hack.bench.lab import Lab
from hack.bench.machine import REPO, cpu_ticks, describe, share_row
from hack.bench.results import ScenarioResult
from hack.bytecode import compile_bytecode

SCENARIOS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (
        discovery,
        prepare,
        installed,
        scale,
        modes,
        health,
        attribution,
        realnode,
        explain,
        fleet,
        showback,
    )
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.bench", description=__doc__)
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(SCENARIOS),
        help="run only this scenario (repeatable)",
    )
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "performance.md")
    parser.add_argument(
        "--summary",
        type=Path,
        default=REPO / "docs" / "bench-summary.json",
        help="headline numbers, compared with the committed file (regressions are reported)",
    )
    parser.add_argument(
        "--no-doc", action="store_true", help="print only, leave the document alone"
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        metavar="MS",
        help="first wait until the calibration (a fixed piece of Python work, read every "
        f"{calibration.POLL_S:g} s) reads at most MS ms per round twice, "
        f"{calibration.CONFIRM_S:g} s apart; the quiet hours of the development machines "
        "read 7.6-8.5 ms",
    )
    parser.add_argument(
        "--wait-limit",
        type=float,
        default=180.0,
        metavar="MIN",
        help="with --wait-quiet: give up after MIN minutes, run nothing and exit 3 (%(default)g)",
    )
    args = parser.parse_args(argv)
    if args.wait_quiet is not None:
        quiet = calibration.wait_until_quiet(args.wait_quiet / 1e3, args.wait_limit * 60)
        if quiet is None:
            print(
                f"the machine did not read {args.wait_quiet} ms or less within "
                f"{args.wait_limit:g} minutes; nothing was run",
                file=sys.stderr,
            )
            return 3
    chosen = [SCENARIOS[n] for n in args.only] if args.only else list(SCENARIOS.values())
    command = (
        "make bench"
        if not args.only
        else "python -m hack.bench " + shlex.join(a for n in args.only for a in ("--only", n))
    )
    machine = describe()
    print(f"machine: {machine}", flush=True)
    compile_bytecode()  # the processes it starts load bytecode, as installed
    lab: Lab | None = None
    blocks: dict[str, str] = {}
    results: list[ScenarioResult] = []
    failed = []
    try:
        for scenario in chosen:
            if scenario.NEEDS_CLUSTER and lab is None:
                print("starting the control plane", flush=True)
                lab = Lab()
            print(f"running {scenario.NAME}", flush=True)
            speed = calibration.measure()
            ticks = cpu_ticks()
            try:
                result = scenario.run(lab if scenario.NEEDS_CLUSTER else None)
            except Exception:
                traceback.print_exc()
                failed.append(scenario.NAME)
                continue
            if result.rows:  # the machine's speed before and after, next to the figures
                result.add(share_row(ticks, cpu_ticks()))
                result.add(calibration.row(speed + calibration.measure()))
            print(report.console(result), flush=True)
            results.append(result)
            blocks[scenario.NAME] = report.markdown(result, command, machine)
    finally:
        if lab is not None:
            lab.close()
    fresh = regression.summarize(results)
    print(regression.report(regression.compare(regression.committed(args.summary, REPO), fresh)))
    if blocks and not args.no_doc:
        report.update_document(args.doc, blocks)
        regression.update(args.summary, fresh)
        print(f"updated {args.doc}, {args.summary.name}: {', '.join(blocks)}")
    if failed:
        print(f"scenarios that failed to run: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
