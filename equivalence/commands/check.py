"""`levels check`: every level against the float64 reference, forward and backward, in both
layouts, at the dtypes asked for (equivalence/check.py is the check itself)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.markup import escape

import levels
from levels.contract import COMPONENTS

from .. import environment
from ..check import check
from .console import (EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, HELP_FORMAT, Column, Sheet, add_filters,
                      fmt_err, library_output_to, log_note, resolve_device, split_list)


def add_parser(sub) -> None:
    p = sub.add_parser("check", formatter_class=HELP_FORMAT,
                       help="check levels against the float64 reference",
                       description="Run forward and backward of each level on fresh random inputs and "
                                   "compare every output and gradient with the float64 reference.\n"
                                   "Exit code 0 only if every check that could run passed.")
    add_filters(p, "tiny", "input size preset: tiny (default), small, bench")
    p.add_argument("--variant", help="one variant only (attention: full/causal; conv_bn: eval/train)")
    p.add_argument("--layout", choices=("contiguous", "strided"),
                   help="one layout only (default: both; strided = every tensor argument a view: "
                        "stride-2 parameters, transposed weights, sliced activations, channels_last)")
    p.add_argument("--repeat", type=int, default=1,
                   help="check every case N times with fresh inputs of the same shapes; TorchScript "
                        "runs its fused graph from the 2nd call on, so use 2 to check that too")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--log", metavar="FILE", default="levels-reports/check.log",
                   help="where messages printed by libraries (compilers, warnings) go")
    p.set_defaults(run=run)


def results_table(results, title) -> Sheet:
    """The results as a `Sheet` (it fits the console it is printed on)."""
    table = Sheet(title, [Column("component"), Column("variant", under="component"), "layout",
                          "level", Column("dtype", under="level"), "status",
                          Column("worst\nrel err", "right"), Column("bound", "right", under="worst\nrel err"),
                          Column("max\nabs err", "right"), Column("worst of", under="max\nabs err")])
    style = {"pass": "green", "fail": "bold red", "error": "bold red", "skip": "yellow"}
    for r in results:
        w = r.worst
        note = r.reason or ("; ".join(f"{c.name}: {c.problem}" for c in r.comparisons if c.problem))
        if r.tf32:
            note = ("TF32 " + note).strip()
        table.add_row(r.component, r.variant, r.layout, r.level, r.dtype,
                      f"[{style[r.status]}]{r.status}[/]",
                      fmt_err(w.rel_err if w else None), fmt_err(r.tolerance),
                      fmt_err(w.max_abs_err if w else None), escape(w.name) if w else "", note=note)
    return table


def run(args, console) -> int:
    device = resolve_device(args.device)
    dtypes = split_list(args.dtype) or ["float32", "bfloat16"]
    comps = split_list(args.component, COMPONENTS, "component") or COMPONENTS
    names = split_list(args.level) or levels.LEVEL_NAMES
    results = []
    log_path = Path(args.log)
    # Libraries' own messages (a cuBLAS context warning from autograd's thread, compiler
    # output) go to the log, as in compare: the terminal shows our status and table.
    with library_output_to(log_path, console) as quiet, quiet.status("checking…") as status:
        for comp in comps:
            for level in names:
                for dtype in dtypes:
                    status.update(f"checking {comp} · {level} · {dtype} on {device}")
                    results += check(comp, level, dtype, device, args.size, args.seed, args.variant,
                                     args.repeat, args.layout)
    results_table(results, f"levels check — size '{args.size}', device {device}").print(console)
    console.print(log_note(log_path))
    if args.json:
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
