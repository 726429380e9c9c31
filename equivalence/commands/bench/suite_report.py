"""`levels bench --suite models` on the terminal: its arguments, its two tables (every shape;
the goals), and the run that writes the JSON and the plot (equivalence/commands/bench/suite.py
measures)."""

from __future__ import annotations

import json

from rich.markup import escape

import levels
from levels.contract import COMPONENTS

from ... import cards, plots, shapes
from ..console import (EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, library_output_to, log_note,
                       progress, resolve_device, split_list)
from .reports import output_path
from .suite import CPU_LEVELS, FLOOR, RECORDED, SUITE, measured, run


def add_suite_arguments(parser) -> None:
    """`levels bench --suite models [--level L] [--shapes PATTERNS]`; --component, --device
    and --out are bench's own."""
    parser.add_argument("--suite", choices=(SUITE,),
                        help="time the levels at the shapes of named real models "
                             "(equivalence/shapes.py) against the best library call per shape "
                             "(SDPA backends, cuBLAS, cuDNN): ratios, goals, JSON and a plot. "
                             "--out: a .json path or a directory (default "
                             "reports/<gpu>-suite-models.json; on a CPU "
                             "levels-reports/cpu-suite-models.json). On a CPU: a smoke run of the "
                             "tiny twins at Levels 1-2 (--level to choose)")
    parser.add_argument("--level", help="with --suite or --overhead: comma-separated levels "
                                        "(default with --suite: triton,cuda on a GPU, "
                                        "native,torchscript on a CPU: compile recompiles at "
                                        "every shape, minutes there)")
    parser.add_argument("--shapes", help="with --suite: comma-separated shape names or patterns "
                                         "(gpt2-*, mlp/llama2-*; default: all)")
    parser.add_argument("--resume", action="store_true",
                        help="with --suite: keep the shapes the report at --out already has (a "
                             "run cut short: the JSON is written after every shape) and time "
                             "only the others")


def _fmt_ms(side: dict) -> str:
    """'0.412 ms' over its p20–p80, or what happened instead."""
    status = side["status"]
    if status != "ok":
        label = {"skip": "[yellow]skip[/]", "error": "[red]error[/]",
                 "wrong": "[bold red]WRONG[/]"}[status]
        return f"{label}\n{escape(side['reason'].splitlines()[0][:24]) if side['reason'] else ''}"
    return f"{side['median_ms']:.3g} ms\n{side['p20_ms']:.2g}–{side['p80_ms']:.2g}"


def _fmt_ratio(side: dict) -> str:
    r = side.get("ratio")
    if r is None:
        return "—"
    style = "green" if r >= 1.0 else ("red" if r < FLOOR else "yellow")
    k = side.get("kernel_ratio")
    return f"[{style}]{r:.2f}×[/]" + (f"\nk {k:.2f}×" if k else "")


def _fmt_first(side: dict) -> str:
    ms = side.get("first_call_ms")
    if ms is None:
        return "—"
    cache = f"\n{side['first_call_cache']} cache" if side.get("first_call_cache") else ""
    return (f"{ms / 1e3:.3g} s" if ms >= 1000 else f"{ms:.3g} ms") + cache


def _rate(entry: dict, side: dict) -> str:
    if side.get("status") != "ok":
        return "—"
    if cards.get(entry["component"]).rate == "TB/s":
        return f"{side['tbps']:.3g} TB/s"
    return f"{side['tflops']:.3g} TFLOP/s"


def _listed(items: list, most: int = 3) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def print_report(report: dict, console) -> None:
    from rich.table import Table

    env, names = report["environment"], report["settings"]["levels"]
    where = env.get("gpu") or f"CPU ({env.get('cpu_threads')} threads)"
    table = Table(title=f"levels bench --suite models — {where}, "
                        f"{'tiny twins' if report['settings']['tiny_twins'] else 'full shapes'}; "
                        f"ratio = best library time / level time (> 1×: the level is faster); "
                        f"k: the same by kernel time (GPU), without the host's time per call")
    table.add_column("shape", no_wrap=True)
    table.add_column("pass", no_wrap=True)
    table.add_column("best library", no_wrap=True)
    for n in names:
        table.add_column(f"{n}\nms, p20–p80", no_wrap=True)
        table.add_column("ratio", no_wrap=True, justify="right")
        table.add_column("first\ncall", no_wrap=True)
    table.add_column("fastest level", no_wrap=True)
    last = None
    for e in report["entries"]:
        if last is not None and e["component"] != last:
            table.add_section()
        last = e["component"]
        lib = e["libraries"].get(e["best_library"]) if e["best_library"] else None
        lib_text = (f"{escape(e['best_library'])}\n{lib['median_ms']:.3g} ms, "
                    f"{lib['p20_ms']:.2g}–{lib['p80_ms']:.2g}" if lib else "[red]none ran[/]")
        cells = []
        for n in names:
            cells += [_fmt_ms(e["levels"][n]), _fmt_ratio(e["levels"][n]), _fmt_first(e["levels"][n])]
        ok = [e["levels"][n] for n in names if e["levels"][n]["status"] == "ok"]
        fastest = min(ok, key=lambda s: s["median_ms"], default=None)
        table.add_row(f"{e['component']} · {e['shape']}\n{e['description']}", e["direction"],
                      lib_text, *cells,
                      f"{fastest['name']}\n{_rate(e, fastest)}" if fastest else "—")
    console.print(table)
    goals = Table(title="goals: per component, geomean of the ratios "
                        f">= goal and no shape below {FLOOR}×"
                        + (" — CPU smoke run: not what the goals are about" if report["smoke"] else ""))
    for col in ("level", "group", "timed", "geomean", "min (at)", "kernel\ngeomean", "goal",
                "status", "why"):
        goals.add_column(col, no_wrap=col != "why", min_width=30 if col == "why" else None)
    style = {"met": "green", "missed": "bold red", "incomplete": "yellow", "not evaluated": "yellow",
             "no goal": "dim"}
    for r in report["summary"]:
        why = "; ".join(filter(None, [
            f"{len(r['below_floor'])} below {FLOOR}× ({_listed(r['below_floor'])})"
            if r["below_floor"] else "",
            f"failed: {_listed(r['failed'])}" if r["failed"] else "",
            f"not timed: {_listed(r['untimed'], 2)}" if r["untimed"] else "", r["note"]]))
        goals.add_row(r["level"], r["group"], f"{r['timed']}/{r['entries']}",
                      f"{r['geomean']:.2f}×" if r["geomean"] else "—",
                      f"{r['min']:.2f}× ({r['min_at']})" if r["min"] is not None else "—",
                      f"{r['kernel_geomean']:.2f}×" if r.get("kernel_geomean") else "—",
                      f"≥ {r['goal']}×" if r["goal"] else "—",
                      f"[{style[r['status']]}]{r['status']}[/]", escape(why))
    console.print(goals)


def run_suite(args, console) -> int:
    """`levels bench --suite models`: exit 0 when it ran (goals are data: see the table),
    1 when a level raised or was wrong at a shape, 3 when nothing could be timed."""
    if getattr(args, "overhead", False):
        raise ValueError("argument '--suite': --suite and --overhead are two different runs; "
                         "pass one of them")
    device = resolve_device(args.device)
    comps = split_list(args.component, COMPONENTS, "component")
    names = [levels.resolve(n).name for n in (split_list(args.level) or [])] or None
    patterns = split_list(getattr(args, "shapes", None))
    chosen = shapes.shapes(comps, patterns)  # a bad pattern is a usage error before any work
    on_gpu = device.startswith("cuda")
    json_path = output_path(args.out, device, f"suite-{SUITE}")
    log_path = json_path.with_suffix(".log")
    earlier = None
    if getattr(args, "resume", False):
        if not json_path.exists():
            raise ValueError(f"argument '--resume': there is no report to resume at {json_path}")
        earlier = json.loads(json_path.read_text())
    command = " ".join(["levels bench --suite", SUITE, "--device", device]
                       + (["--component", args.component] if args.component else [])
                       + (["--level", args.level] if args.level else [])
                       + (["--shapes", args.shapes] if getattr(args, "shapes", None) else [])
                       + (["--out", str(args.out)] if args.out is not None else [])
                       + (["--resume"] if getattr(args, "resume", False) else []))
    if not on_gpu:
        recorded = (f"the recorded H100 run is {RECORDED}" if RECORDED.exists()
                    else "no H100 run is recorded in reports/ yet")
        console.print(f"levels bench --suite models on a CPU: a smoke run (the tiny twin of each "
                      f"shape, float32, {', '.join(names or CPU_LEVELS)} against the same library "
                      f"calls on this CPU; Level 3 only with --level compile: it compiles at every "
                      f"shape, minutes on a CPU). The "
                      f"suite's goals are GPU figures: the real suite needs a CUDA GPU "
                      f"(`levels bench --suite models --device cuda`); {recorded}.",
                      markup=False, highlight=False)
    with library_output_to(log_path, console) as quiet:
        with progress(quiet, len(chosen)) as bar:
            task = bar.add_task("suite", total=len(chosen))
            report = run(device, names, comps, patterns, out_path=json_path, command=command,
                         on_side=lambda text: bar.update(task, description=text[:60]),
                         on_shape=lambda shape: bar.advance(task), resume=earlier)
        png = plots.suite_figure(report, json_path.with_suffix(".png")) if measured(report) \
            else None
    if png is None:
        console.print("levels bench --suite models: nothing could be timed here, so nothing was "
                      f"written; {log_note(log_path)}", markup=False, highlight=False)
        return EXIT_NOTHING_RAN
    print_report(report, console)
    console.print(f"wrote {json_path} and {png}; {log_note(log_path)}", markup=False,
                  highlight=False)
    bad = any(s["status"] in ("error", "wrong") for e in report["entries"]
              for s in e["levels"].values())
    return EXIT_FAILED if bad else EXIT_OK




__all__ = ["add_suite_arguments", "print_report", "run_suite"]
