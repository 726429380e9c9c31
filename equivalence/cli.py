"""The `levels` command line: check, compare, agree, explain, bench."""

from __future__ import annotations

import argparse
import sys

import levels
from levels.contract import COMPONENTS

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_RAN = 0, 1, 2, 3


def _levels_help() -> str:
    lines = ["the five levels (name or number):"]
    for info in levels.LEVELS:
        lines.append(f"  {info.number} {info.name:<12} {info.title}")
        lines.append(f"      adds:  {info.idea}")
        lines.append(f"      costs: {info.cost}")
    return "\n".join(lines)


DESCRIPTION = f"""\
Five implementations of the same neural-network components, from idiomatic PyTorch down
to hand-written GPU kernels, and a harness that proves they compute the same function.

components: {", ".join(COMPONENTS)}

{_levels_help()}

"Identical" means: every output and every gradient within a per-dtype relative-error
bound of an independent float64 reference (see equivalence/tolerances.py).
"""

EPILOG = """\
examples:
  levels check --level native                 all components, fp32 and bf16, forward+backward
  levels check --component attention --level 4 --dtype bf16 --device cuda
  levels compare                               check and time every level on this machine
  levels agree --component lstm                level-vs-level agreement matrix
  levels explain --component mlp --level compile   what a level actually runs
  levels bench --component layer_norm          the speed goals (GPU), vs same-run baselines

exit codes: 0 all good, 1 a check failed, 2 bad arguments, 3 nothing could run here
"""


def _split(value: str | None, choices=None, what="value") -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if choices is not None:
        for item in items:
            if item not in choices:
                raise argparse.ArgumentTypeError(
                    f"argument '--{what}' must be one of {', '.join(choices)}; got {item!r}")
    return items


def _add_filters(p: argparse.ArgumentParser, size_default: str | None, size_help: str):
    p.add_argument("--component", help=f"comma-separated, from: {', '.join(COMPONENTS)} "
                                       "(default: all)")
    p.add_argument("--level", help="comma-separated level names or numbers 1-5 (default: all)")
    p.add_argument("--dtype", help="comma-separated: float32/fp32, float16/fp16, bfloat16/bf16")
    p.add_argument("--device", help="cpu or cuda (default: cuda if there is a GPU, else cpu)")
    p.add_argument("--size", default=size_default, help=size_help)
    p.add_argument("--seed", type=int, help="replay a run (default: fresh random inputs)")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="levels", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("check", formatter_class=fmt, help="check levels against the float64 reference",
                       description="Run forward and backward of each level on fresh random inputs and "
                                   "compare every output and gradient with the float64 reference.\n"
                                   "Exit code 0 only if every check that could run passed.")
    _add_filters(p, "tiny", "input size preset: tiny (default), small, bench")
    p.add_argument("--variant", help="one variant only (attention: full/causal; conv_bn: eval/train)")
    p.add_argument("--repeat", type=int, default=1,
                   help="check every case N times with fresh inputs of the same shapes; TorchScript "
                        "runs its fused graph from the 2nd call on, so use 2 to check that too")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")

    p = sub.add_parser("compare", formatter_class=fmt,
                       help="check and time every component x level; writes compare.json/png",
                       description="For every component and level: check it (at --check-size), then "
                                   "time it (at --size): first call (compile/build) separately from "
                                   "steady state, forward and forward+backward, peak GPU memory.")
    _add_filters(p, None, "timing size preset (default: small on CPU, bench on GPU)")
    p.add_argument("--check-size", default="small", help="size preset of the checks (default: small)")
    p.add_argument("--out", default="levels-reports", help="directory for compare.json and compare.png")

    p = sub.add_parser("agree", formatter_class=fmt, help="level-vs-level agreement matrix",
                       description="Relative difference between every pair of levels (and the float64 "
                                   "reference) on the same inputs, worst over outputs and gradients.")
    p.add_argument("--component", required=True, choices=COMPONENTS)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device")
    p.add_argument("--size", default="tiny")
    p.add_argument("--variant")
    p.add_argument("--seed", type=int)

    p = sub.add_parser("explain", formatter_class=fmt, help="show what a level actually runs",
                       description="native: the ATen ops a call dispatches; torchscript: the optimized "
                                   "graph; compile: Inductor's generated code; triton: kernel source "
                                   "(and PTX/SASS summary on a GPU).")
    p.add_argument("--component", required=True, choices=COMPONENTS)
    p.add_argument("--level", required=True)
    p.add_argument("--device")

    p = sub.add_parser("bench", formatter_class=fmt, help="the speed goals, vs baselines timed in the same run",
                       description="Times the kernels against the baselines each goal names (copy "
                                   "bandwidth, eager PyTorch, torch.compile, cuDNN, SDPA) in one run and "
                                   "reports the ratios. Meant for a GPU.")
    p.add_argument("--component", help="comma-separated (default: all with a benchmark)")
    p.add_argument("--device")
    p.add_argument("--out", default="levels-reports", help="directory for bench.json")
    return parser


def _device(value):
    from . import environment
    return value or str(environment.default_device())


def _fmt_err(x: float | None) -> str:
    if x is None or x != x:
        return "—"
    return f"{x:.1e}"


def _check_table(results, title):
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("component", "variant", "level", "dtype", "status", "worst rel err", "bound",
                "max abs err", "worst of", "note"):
        table.add_column(col, no_wrap=col not in ("note",))
    style = {"pass": "green", "fail": "bold red", "error": "bold red", "skip": "yellow"}
    for r in results:
        w = r.worst
        note = r.reason or ("; ".join(f"{c.name}: {c.problem}" for c in r.comparisons if c.problem))
        if r.tf32:
            note = ("TF32 " + note).strip()
        table.add_row(r.component, r.variant, r.level, r.dtype,
                      f"[{style[r.status]}]{r.status}[/]",
                      _fmt_err(w.rel_err if w else None), _fmt_err(r.tolerance),
                      _fmt_err(w.max_abs_err if w else None), w.name if w else "", note[:160])
    return table


def cmd_check(args, console) -> int:
    import json

    from .check import check

    device = _device(args.device)
    dtypes = _split(args.dtype) or ["float32", "bfloat16"]
    results = []
    with console.status("checking…") as status:
        for comp in _split(args.component, COMPONENTS, "component") or COMPONENTS:
            for level in _split(args.level) or levels.LEVEL_NAMES:
                for dtype in dtypes:
                    status.update(f"checking {comp} · {level} · {dtype} on {device}")
                    results += check(comp, level, dtype, device, args.size, args.seed, args.variant,
                                     args.repeat)
    console.print(_check_table(results, f"levels check — size '{args.size}', device {device}"))
    if args.json:
        from . import environment
        with open(args.json, "w") as f:
            json.dump({"environment": environment.describe(device), "command": sys.argv[1:],
                       "results": [r.to_dict() for r in results]}, f, indent=2)
    ran = [r for r in results if r.status != "skip"]
    failed = [r for r in ran if not r.passed]
    console.print(f"{len(ran) - len(failed)} passed, {len(failed)} failed, "
                  f"{len(results) - len(ran)} skipped")
    if failed:
        return EXIT_FAILED
    return EXIT_OK if ran else EXIT_NOTHING_RAN


def _ms(t) -> str:
    return f"{t['median_ms']:.3g}" if t else "—"


def cmd_compare(args, console) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from . import compare

    comps = _split(args.component, COMPONENTS, "component") or list(COMPONENTS)
    names = _split(args.level) or list(levels.LEVEL_NAMES)
    dtype = (_split(args.dtype) or ["float32"])[0]
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("comparing", total=len(comps) * len(names))
        first = [True]

        def step(description):
            if not first[0]:
                progress.advance(task)
            first[0] = False
            progress.update(task, description=description)

        report = compare.compare(comps, names, dtype, _device(args.device), args.size,
                                 args.check_size, args.seed, on_step=step)
        progress.advance(task)
    json_path, png_path = compare.save(report, args.out)

    s = report["settings"]
    table = Table(title=f"levels compare — {s['dtype']}, time at '{s['size']}', check at "
                        f"'{s['check_size']}', {report['environment'].get('gpu') or 'CPU'}")
    for col in ("component", "level", "check", "first call ms", "fwd ms", "fwd+bwd ms", "fwd TFLOP/s",
                "fwd TB/s", "break-even calls", "note"):
        table.add_column(col)
    failed = False
    for r in report["rows"]:
        check_style = {"pass": "green", "FAIL": "bold red", "skip": "yellow"}[r["check"]]
        failed |= r["check"] == "FAIL" or r["status"] == "error"
        tp = r["throughput"]["fwd"]
        be = r["break_even_calls_vs_native"]
        be = "never" if be is None and r["level"] != "native" and r["status"] == "ok" else be
        table.add_row(r["component"], r["level"], f"[{check_style}]{r['check']}[/]",
                      f"{r['first_call_ms']:.4g}" if r["first_call_ms"] else "—",
                      _ms(r["fwd"]), _ms(r["fwd_bwd"]),
                      f"{tp['tflops']:.3g}" if tp else "—", f"{tp['tbps']:.3g}" if tp else "—",
                      "—" if be is None else str(be), (r["reason"] or r["notes"])[:120])
    console.print(table)
    console.print(f"wrote {json_path} and {png_path}")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_agree(args, console) -> int:
    from rich.table import Table

    from .agreement import agreement

    a = agreement(args.component, args.dtype, _device(args.device), args.size, args.variant,
                  seed=args.seed)
    table = Table(title=f"{a.component} [{a.variant}] {a.dtype}: max relative difference "
                        f"(row vs column), seed {a.seed}")
    table.add_column("")
    for n in a.names:
        table.add_column(n, justify="right")
    for n, row in zip(a.names, a.matrix):
        table.add_row(n, *[_fmt_err(x) if x else "0" for x in row])
    console.print(table)
    for name, reason in a.skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {reason}")
    bad = any(x != x for row in a.matrix for x in row)
    return EXIT_FAILED if bad else EXIT_OK


def cmd_explain(args, console) -> int:
    try:
        from .explain import explain
    except ModuleNotFoundError:
        console.print("explain is not available in this version")
        return EXIT_NOTHING_RAN
    console.print(explain(args.component, levels.resolve(args.level).name, _device(args.device)),
                  markup=False, highlight=False)
    return EXIT_OK


def cmd_bench(args, console) -> int:
    from rich.table import Table

    from . import bench

    report = bench.run(_split(args.component, COMPONENTS, "component"), _device(args.device), args.out)
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


def main(argv=None) -> int:
    from rich.console import Console

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    console = Console(width=max(Console().width, 150) if not sys.stdout.isatty() else None)
    handler = {"check": cmd_check, "compare": cmd_compare, "agree": cmd_agree,
               "explain": cmd_explain, "bench": cmd_bench}[args.command]
    try:
        return handler(args, console)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        console.print(f"[red]levels {args.command}: {exc}[/]")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
