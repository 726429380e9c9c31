"""`levels bench`: three runs of one command.

    levels bench                    the speed goals, each a ratio to a baseline timed in the
                                    same run (goals.py, and one module per component here)
    levels bench --suite models     every level against the best library call at the shapes
                                    of named models (suite.py measures, suite_report.py prints)
    levels bench --overhead         what one call costs the host, per level (overhead.py)
"""

from __future__ import annotations

from levels.contract import COMPONENTS

from ...settings import RECORDED
from ..console import EXIT_NOTHING_RAN, EXIT_OK, HELP_FORMAT, resolve_device, split_list
from . import goals, overhead, suite_report


def add_parser(sub) -> None:
    p = sub.add_parser("bench", formatter_class=HELP_FORMAT,
                       help="the speed goals, vs baselines timed in the same run",
                       description="Times the kernels against the baselines each goal names (copy "
                                   "bandwidth, eager PyTorch, torch.compile, cuDNN, SDPA) in one run and "
                                   "reports the ratios. The goals are GPU figures: without a GPU it "
                                   "points to the recorded H100 results instead.")
    p.add_argument("--component", help="comma-separated (default: all with a benchmark)")
    p.add_argument("--device")
    p.add_argument("--out", help="directory for bench.json (default levels-reports); with --suite or "
                                 "--overhead a .json path or a directory (default reports/<gpu>-...json)")
    suite_report.add_suite_arguments(p)
    overhead.add_overhead_arguments(p)
    p.set_defaults(run=run)


def run(args, console) -> int:
    from rich.table import Table

    if args.suite:
        return suite_report.run_suite(args, console)
    if args.overhead:
        return overhead.run_overhead(args, console)
    if args.level or args.shapes or args.resume:
        raise ValueError("arguments '--level', '--shapes', '--resume' go with --suite (--level also "
                         "with --overhead)")
    args.out = args.out or "levels-reports"
    components = split_list(args.component, COMPONENTS, "component")
    device = resolve_device(args.device)
    if not device.startswith("cuda"):
        recorded = RECORDED / "h100-bench.json"
        where = recorded if recorded.exists() else "reports/h100-bench.json in the levels repository"
        console.print("levels bench: the speed goals are GPU figures (ratios against cuBLAS, cuDNN, "
                      "SDPA and copy bandwidth on an H100), and this run has no GPU, so nothing was "
                      f"timed or written. The recorded H100 results are in {where}; "
                      "`levels compare` and `levels profile` time the levels on this CPU.")
        return EXIT_NOTHING_RAN
    report = goals.run(components, device, args.out)
    table = Table(title=f"levels bench — {report['environment'].get('gpu') or 'CPU'}")
    for col in ("component", "figure", "level", "dtype", "ms", "TFLOP/s", "TB/s", "vs", "ratio", "goal",
                "met"):
        table.add_column(col)
    for f in report["figures"]:
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: ""}[f["met"]]
        table.add_row(f["component"], f["name"], f["level"], f["dtype"], f"{f['ms']:.4g}",
                      f"{f['tflops']:.1f}" if f["tflops"] else "", f"{f['tbps']:.2f}" if f["tbps"] else "",
                      f["baseline"] or "", f"{f['ratio']:.2f}" if f["ratio"] else "",
                      f"≥{f['goal']}" if f["goal"] else "", met)
    if report["figures"]:
        console.print(table)
    for comp, reason in report["skipped"].items():
        console.print(f"[yellow]skipped {comp}[/]: {reason}")
    console.print(f"wrote {args.out}/bench.json")
    return EXIT_OK if report["figures"] else EXIT_NOTHING_RAN
