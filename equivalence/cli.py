"""The `levels` command line: check, compare, profile, select, agree, explain, bench."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from pathlib import Path

from rich.markup import escape

import levels
from levels.contract import COMPONENTS

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_RAN = 0, 1, 2, 3


class NothingToRun(Exception):
    """The request is valid but this machine cannot serve it (exit 3), e.g. no GPU."""


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
  levels profile --component mlp --scaling     one component in depth: times, roofline, plots
  levels select --component layer_norm         which level level="auto" picks here, and why
  levels agree --component lstm                level-vs-level agreement matrix
  levels explain --component mlp --level compile   what a level actually runs
  levels bench --component layer_norm          the speed goals (GPU), vs same-run baselines
  levels bench --suite models                  every level vs the best library call at real models' shapes
  levels bench --overhead                      what one call costs the host, per level
  levels doctor                                what works on this machine, and how to fix the rest
  levels train --model gpt --level all         a whole model at every level: same loss curve, speed
  levels assignment build --components layer_norm --levels native,triton --out DIR
  levels grade --repo DIR --gradescope results.json

exit codes: 0 all good, 1 a check failed (or a level raised), 2 bad arguments,
            3 nothing could run here (e.g. --device cuda without a GPU)
"""

COMPILE_MODE_HELP = ("Level 3's torch.compile mode: 'default' (the default, or $LEVELS_COMPILE_MODE) or "
                     "'max-autotune-no-cudagraphs', which benchmarks GEMM/conv candidates for every "
                     "shape: on a GPU it adds minutes to a cold run (later runs hit the disk cache), "
                     "on a CPU it changes little")



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


def _add_filters(p: argparse.ArgumentParser, size_default: str | None, size_help: str,
                 dtype_help: str = "comma-separated: float32/fp32, float16/fp16, bfloat16/bf16 "
                                   "(default: float32,bfloat16)"):
    p.add_argument("--component", help=f"comma-separated, from: {', '.join(COMPONENTS)} "
                                       "(default: all)")
    p.add_argument("--level", help="comma-separated level names or numbers 1-5 (default: all)")
    p.add_argument("--dtype", help=dtype_help)
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if there is a GPU, else cpu)")
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
    p.add_argument("--layout", choices=("contiguous", "strided"),
                   help="one layout only (default: both; strided = every tensor argument a view: "
                        "stride-2 parameters, transposed weights, sliced activations, channels_last)")
    p.add_argument("--repeat", type=int, default=1,
                   help="check every case N times with fresh inputs of the same shapes; TorchScript "
                        "runs its fused graph from the 2nd call on, so use 2 to check that too")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--log", metavar="FILE", default="levels-reports/check.log",
                   help="where messages printed by libraries (compilers, warnings) go")

    p = sub.add_parser("compare", formatter_class=fmt,
                       help="check and time every component x level; writes compare.json/png/log",
                       description="For every component and level: time it (at --size): first call "
                                   "(compile/build, and whether it found a warm cache) separately from "
                                   "steady state, forward and forward+backward, peak GPU memory, "
                                   "break-even against native; then, every row timed, check it (at "
                                   "--check-size).\n"
                                   "Prints only a progress bar and the table; what libraries print "
                                   "(compiler logs, warnings) goes to compare.log next to the report.")
    _add_filters(p, None, "timing size preset (default: small on CPU, bench on GPU)",
                 "float32/fp32, float16/fp16, bfloat16/bf16 (default: bfloat16 on a GPU, float32 on a CPU)")
    p.add_argument("--check-size", default="small", help="size preset of the checks (default: small)")
    p.add_argument("--compile-mode", choices=("default", "max-autotune-no-cudagraphs"),
                   help=COMPILE_MODE_HELP)
    p.add_argument("--out", default="levels-reports",
                   help="directory for compare.json, compare.png and compare.log")

    p = sub.add_parser("profile", formatter_class=fmt, help="one component in depth: times, roofline, plots",
                       description="Per level: steady-state median and p20/p80 (forward, forward+backward), "
                                   "first call (warm or cold cache), break-even against native, host "
                                   "time per call (the 'tiny' size end to end: the per-call overhead), "
                                   "peak memory, achieved TFLOP/s and TB/s and their fraction of this "
                                   "device's measured ceilings (copy bandwidth, matmul rate; measured "
                                   "once, cached). Native is always profiled: it is the baseline.\n"
                                   "Writes profile-C.json, profile-C.png (speed-up, first call), "
                                   "roofline-C.png, with --scaling scaling-C.png, and profile.log.")
    p.add_argument("--component", required=True, choices=COMPONENTS)
    p.add_argument("--level", help="comma-separated level names or numbers 1-5 (default: all)")
    p.add_argument("--dtype", help="float32/fp32, float16/fp16, bfloat16/bf16 "
                                   "(default: bfloat16 on a GPU, float32 on a CPU)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if there is a GPU, else cpu)")
    p.add_argument("--size", help="size preset (default: small on CPU, bench on GPU)")
    p.add_argument("--variant", help="one variant (attention: full/causal; conv_bn: eval/train)")
    p.add_argument("--scaling", action="store_true",
                   help="also time each level at 1/8 to 2x the size along one dimension "
                        "(a compile per size for Level 3) and plot time against size")
    p.add_argument("--trace", metavar="DIR", help="write a torch.profiler Chrome trace per level to DIR "
                                                  "(open it in https://ui.perfetto.dev)")
    p.add_argument("--compile-mode", choices=("default", "max-autotune-no-cudagraphs"),
                   help=COMPILE_MODE_HELP)
    p.add_argument("--out", default="levels-reports", help="directory for the JSON, PNGs and log")
    p.add_argument("--seed", type=int, help="replay a run (default: fresh random inputs)")

    p = sub.add_parser("select", formatter_class=fmt, help='which level level="auto" picks, and why',
                       description='The decision table behind level="auto": every level checked against '
                                   'the float64 reference on the size\'s inputs, then timed; the fastest '
                                   'that passes wins (within 5%%, the lower rung). Measured once per '
                                   'component, variant, shape class, dtype and device, and cached in '
                                   '~/.cache/levels/auto.json (or $LEVELS_CACHE_DIR).')
    p.add_argument("--component", help=f"comma-separated, from: {', '.join(COMPONENTS)} (default: all)")
    p.add_argument("--dtype", help="float32/fp32, float16/fp16, bfloat16/bf16 "
                                   "(default: bfloat16 on a GPU, float32 on a CPU)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if there is a GPU, else cpu)")
    p.add_argument("--size", help="size preset (default: small on CPU, bench on GPU)")
    p.add_argument("--inference", action="store_true",
                   help="decide by the forward time (default: forward+backward, i.e. training)")
    p.add_argument("--remeasure", action="store_true", help="measure again instead of using the cache")

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
                                   "reports the ratios. The goals are GPU figures: without a GPU it "
                                   "points to the recorded H100 results instead.")
    p.add_argument("--component", help="comma-separated (default: all with a benchmark)")
    p.add_argument("--device")
    p.add_argument("--out", help="directory for bench.json (default levels-reports); with --suite or "
                                 "--overhead a .json path or a directory (default reports/<gpu>-...json)")
    from .bench.suite import add_suite_arguments
    from .overhead import add_overhead_arguments
    add_suite_arguments(p)
    add_overhead_arguments(p)
    from . import doctor, train
    from .grading import add_parsers as add_instructor_parsers
    doctor.add_parser(sub)
    train.add_parser(sub)
    add_instructor_parsers(sub)  # `levels assignment build`, `levels grade`
    return parser


def _device(value: str | None) -> str:
    """The device to run on, checked before anything runs: a bad name is a usage error
    (exit 2), a valid one this machine lacks is NothingToRun (exit 3) with the reason."""
    import torch

    from . import environment
    device = environment.parse_device(value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is a CPU-only build (torch.version.cuda is None)"
                   if torch.version.cuda is None else "no GPU is visible to the CUDA driver")
            raise NothingToRun(f"no CUDA GPU here: torch.cuda.is_available() is False; {why}. "
                               "Run on a machine with an NVIDIA GPU, or use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise NothingToRun(f"no {device} here: this machine has {torch.cuda.device_count()} "
                               f"GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return str(device)


@contextlib.contextmanager
def _library_output_to(log_path: Path, console):
    """Run the block with everything but our console going to `log_path`: Python's
    sys.stdout/sys.stderr (warnings, logging, tracebacks libraries print) and the process's
    file descriptors 1 and 2 (C++ code, compiler subprocesses inherit them). Yields a
    console that still writes where ours did. Libraries talk to their authors; a user
    running `compare` wants our progress bar and table, and the log when something breaks."""
    from rich.console import Console

    log_path.parent.mkdir(parents=True, exist_ok=True)
    ours = console.file
    for stream in (sys.stdout, sys.stderr, ours):
        stream.flush()
    terminal = None
    try:
        if ours.fileno() in (1, 2):  # a real terminal or file: keep a handle of its own
            terminal = os.fdopen(os.dup(ours.fileno()), "w", buffering=1,
                                 encoding=getattr(ours, "encoding", None) or "utf-8", errors="replace")
    except (AttributeError, OSError, ValueError):
        pass  # a notebook's or pytest's stream has no descriptor: fds 1/2 are not it
    quiet = Console(file=terminal or ours, width=console.width if not console.is_terminal else None)
    with open(log_path, "w", buffering=1, encoding="utf-8", errors="replace") as log:
        saved_fds = [os.dup(1), os.dup(2)]
        saved_streams = sys.stdout, sys.stderr
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        try:
            with warnings.catch_warnings():
                # to the log whoever records warnings (pytest, a notebook): a library's
                # warning is its message to its own users, not ours
                warnings.showwarning = lambda message, category, filename, lineno, file=None, \
                    line=None: log.write(warnings.formatwarning(message, category, filename, lineno, line))
                yield quiet
        finally:
            log.flush()
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
            if terminal is not None:
                terminal.flush()
                terminal.close()


def _log_note(log_path: Path) -> str:
    try:
        lines = sum(1 for line in log_path.read_text(errors="replace").splitlines() if line.strip())
    except OSError:
        return ""
    if not lines:
        return f"libraries printed nothing ({log_path} is empty)"
    return f"messages printed by libraries (compilers, warnings): {lines} line(s) in {log_path}"


def _compile_mode(value: str | None, device: str):
    """The context in which Level 3 compiles in the chosen mode (compare.resolve_compile_mode)."""
    from . import compare
    return compare.CompileMode(compare.resolve_compile_mode(value), device)


def _fmt_err(x: float | None) -> str:
    if x is None or x != x:
        return "—"
    return f"{x:.1e}"


def _check_table(results, title):
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("component", "variant", "layout", "level", "dtype", "status", "worst rel err",
                "bound", "max abs err", "worst of", "note"):
        table.add_column(col, no_wrap=col not in ("note",))
    style = {"pass": "green", "fail": "bold red", "error": "bold red", "skip": "yellow"}
    for r in results:
        w = r.worst
        note = r.reason or ("; ".join(f"{c.name}: {c.problem}" for c in r.comparisons if c.problem))
        if r.tf32:
            note = ("TF32 " + note).strip()
        note = escape(note)
        table.add_row(r.component, r.variant, r.layout, r.level, r.dtype,
                      f"[{style[r.status]}]{r.status}[/]",
                      _fmt_err(w.rel_err if w else None), _fmt_err(r.tolerance),
                      _fmt_err(w.max_abs_err if w else None), w.name if w else "", note)
    return table


def cmd_check(args, console) -> int:
    import json

    from .check import check

    device = _device(args.device)
    dtypes = _split(args.dtype) or ["float32", "bfloat16"]
    comps = _split(args.component, COMPONENTS, "component") or COMPONENTS
    names = _split(args.level) or levels.LEVEL_NAMES
    results = []
    log_path = Path(args.log)
    # Libraries' own messages (a cuBLAS context warning from autograd's thread, compiler
    # output) go to the log, as in compare: the terminal shows our status and table.
    with _library_output_to(log_path, console) as quiet, quiet.status("checking…") as status:
        for comp in comps:
            for level in names:
                for dtype in dtypes:
                    status.update(f"checking {comp} · {level} · {dtype} on {device}")
                    results += check(comp, level, dtype, device, args.size, args.seed, args.variant,
                                     args.repeat, args.layout)
    console.print(_check_table(results, f"levels check — size '{args.size}', device {device}"))
    console.print(_log_note(log_path))
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


def _spread(t) -> str:
    return f"{t['median_ms']:.3g}\n{t['p20_ms']:.3g}–{t['p80_ms']:.3g}" if t else "—"


def _first_call(r: dict) -> str:
    if not r["first_call_ms"]:
        return "—"
    cache = f" {r['first_call_cache']}" if r.get("first_call_cache") else ""
    return f"{r['first_call_ms']:.0f} ms{cache}" if r["first_call_ms"] >= 10 else \
        f"{r['first_call_ms']:.2g} ms{cache}"


def _break_even(r: dict) -> str:
    be = r.get("break_even_calls_vs_native")
    if r["level"] == "native":
        return "baseline" if r["status"] == "ok" else "—"
    return "—" if be is None else str(be)


def _progress(console, total: int):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # redirect_*=False: rich would otherwise re-print what libraries write above the bar
    return Progress(TextColumn("{task.description:<28}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                    console=console, transient=True, redirect_stdout=False, redirect_stderr=False)


def cmd_compare(args, console) -> int:
    from rich.table import Table

    from . import compare

    comps = _split(args.component, COMPONENTS, "component") or list(COMPONENTS)
    names = [levels.resolve(n).name for n in _split(args.level) or levels.LEVEL_NAMES]
    device = _device(args.device)
    dtype = (_split(args.dtype) or [compare.default_dtype(device)])[0]
    out = Path(args.out)
    log_path = out / "compare.log"
    with _library_output_to(log_path, console) as quiet:
        steps = 2 * len(comps) * len(names)  # each row is timed, then (all timed) checked
        with _progress(quiet, steps) as progress:
            task = progress.add_task("comparing", total=steps)
            first = [True]

            def step(description):
                if not first[0]:
                    progress.advance(task)
                first[0] = False
                progress.update(task, description=description)

            report = compare.compare(comps, names, dtype, device, args.size, args.check_size,
                                     args.seed, on_step=step, compile_mode=args.compile_mode)
            progress.advance(task)
        json_path, png_path = compare.save(report, out)

    s = report["settings"]
    table = Table(title=f"levels compare — {s['dtype']}, time at '{s['size']}', check at "
                        f"'{s['check_size']}', {report['environment'].get('gpu') or 'CPU'}, "
                        f"torch.compile mode '{s['compile_mode']}'")
    for col in ("component", "level", "check", "first call", "fwd ms", "fwd+bwd ms", "fwd TFLOP/s",
                "fwd TB/s", "break-even calls", "note"):
        table.add_column(col, no_wrap=col != "note", ratio=1 if col == "note" else None,
                         min_width=24 if col == "note" else None)
    failed = False
    for r in report["rows"]:
        check_style = {"pass": "green", "FAIL": "bold red", "skip": "yellow"}[r["check"]]
        failed |= r["check"] == "FAIL" or r["status"] == "error"
        tp = r["throughput"]["fwd"]
        table.add_row(r["component"], r["level"], f"[{check_style}]{r['check']}[/]", _first_call(r),
                      _ms(r["fwd"]), _ms(r["fwd_bwd"]),
                      f"{tp['tflops']:.3g}" if tp else "—", f"{tp['tbps']:.3g}" if tp else "—",
                      _break_even(r), escape(r["reason"] or r["notes"]))
    console.print(table)
    console.print("first call: cold = it compiled (its cache gained files), warm = it found its "
                  "work in the on-disk cache. break-even: calls until a level's first call is paid "
                  "back by its faster steady state against native; never = not faster.")
    console.print(f"wrote {json_path} and {png_path}; {_log_note(log_path)}")
    return EXIT_FAILED if failed else EXIT_OK


def _pct(x: float | None) -> str:
    return f"{x:.0%}" if x is not None else "—"


def cmd_profile(args, console) -> int:
    import json

    from rich.table import Table

    from . import ceilings as ceil
    from . import compare, environment, plots, specs
    from .check import fresh_seed, resolve_dtype
    from .profile import SCALING_DIMS, break_even_calls, profile, scaling

    device = _device(args.device)
    dtype = resolve_dtype(args.dtype or compare.default_dtype(device))
    size = args.size or ("bench" if device.startswith("cuda") else "small")
    spec = specs.get(args.component)
    variant = args.variant or next(iter(spec.variants))
    if variant not in spec.variants:
        raise ValueError(f"argument '--variant' must be one of {sorted(spec.variants)}; got {variant!r}")
    if size not in spec.sizes:
        raise ValueError(f"argument '--size' must be one of {sorted(spec.sizes)}; got {size!r}")
    names = [levels.resolve(n).name for n in _split(args.level) or levels.LEVEL_NAMES]
    names = ["native"] + [n for n in names if n != "native"]  # the baseline, always
    seed = fresh_seed() if args.seed is None else args.seed
    out = Path(args.out)
    log_path = out / "profile.log"
    rows, points = [], []
    with _library_output_to(log_path, console) as quiet, _compile_mode(args.compile_mode, device) as mode:
        steps = len(names) * (2 if args.scaling else 1) + 1
        with _progress(quiet, steps) as progress:
            task = progress.add_task("measuring ceilings", total=steps)
            c = ceil.get(device, dtype)
            progress.advance(task)
            profiles = {}
            for name in names:
                progress.update(task, description=f"{args.component} · {name}")
                profiles[name] = profile(args.component, name, dtype, device, size, variant, seed,
                                         host_size="tiny", ceilings=c, trace_dir=args.trace)
                progress.advance(task)
            for name in names:
                row = profiles[name].to_dict()
                row["break_even_calls_vs_native"] = (None if name == "native" else
                                                     break_even_calls(profiles[name], profiles["native"]))
                rows.append(row)
            if args.scaling:
                for name in names:
                    progress.update(task, description=f"scaling · {name}")
                    if profiles[name].status == "ok":
                        points += scaling(args.component, name, dtype, device, size, variant, seed)[1]
                    progress.advance(task)
        env = environment.describe(device)
        settings = {"component": args.component, "levels": names, "dtype": rows[0]["dtype"],
                    "device": device, "size": size, "variant": variant, "seed": seed,
                    "compile_mode": mode.mode}
        stem = args.component
        files = [plots.levels_figure(rows, settings, env, out / f"profile-{stem}.png"),
                 plots.roofline_figure(rows, c.to_dict(), settings, env, out / f"roofline-{stem}.png")]
        if args.scaling:
            files.append(plots.scaling_figure(points, args.component, SCALING_DIMS[args.component],
                                              settings, env, out / f"scaling-{stem}.png"))
        json_path = out / f"profile-{stem}.json"
        json_path.write_text(json.dumps({"environment": env, "settings": settings,
                                         "ceilings": c.to_dict(), "rows": rows,
                                         "scaling": points}, indent=2))

    table = Table(title=escape(f"levels profile — {args.component} [{variant}], {settings['dtype']}, "
                               f"size '{size}', {env.get('gpu') or 'CPU'}"))
    for col in ("level", "fwd ms\np20–p80", "fwd+bwd ms\np20–p80", "first call", "break-even",
                "host\nms/call", "peak\nMB", "fwd+bwd\nTFLOP/s", "fwd+bwd\nTB/s", "note"):
        table.add_column(col, no_wrap=col != "note", min_width=24 if col == "note" else None)
    errors = False
    for r in rows:
        errors |= r["status"] == "error"
        tp = r["throughput"]["fwd_bwd"]
        table.add_row(r["level"], _spread(r["fwd"]), _spread(r["fwd_bwd"]), _first_call(r),
                      _break_even(r), _ms(r["host"]),
                      f"{r['peak_memory_mb']:.1f}" if r["peak_memory_mb"] is not None else "—",
                      f"{tp['tflops']:.3g}\n{_pct(tp.get('of_matmul'))} of matmul" if tp else "—",
                      f"{tp['tbps']:.3g}\n{_pct(tp.get('of_copy'))} of copy" if tp else "—",
                      escape(r["reason"] or r["notes"]))
        table.add_section()
    console.print(table)
    console.print(f"ceilings of this device ({c.source}): copy {c.copy_tbps * 1e3:.3g} GB/s, "
                  f"{c.dtype} matmul {c.matmul_tflops:.3g} TFLOP/s. host ms/call: size 'tiny', calls "
                  "back to back: what one call costs the CPU, the floor under every time above.")
    traces = [r["trace"] for r in rows if r.get("trace")]
    if traces:
        console.print(f"Chrome traces (open in https://ui.perfetto.dev): {', '.join(traces)}")
    console.print(f"wrote {json_path}, {', '.join(str(f) for f in files)}; {_log_note(log_path)}")
    if errors:
        return EXIT_FAILED
    return EXIT_OK if any(r["status"] == "ok" for r in rows) else EXIT_NOTHING_RAN


def cmd_select(args, console) -> int:
    from rich.table import Table

    from . import compare, specs
    from .check import fresh_seed, resolve_dtype
    from .ceilings import cache_path
    from .select import TIE, decide

    device = _device(args.device)
    dtype = resolve_dtype(args.dtype or compare.default_dtype(device))
    size = args.size or ("bench" if device.startswith("cuda") else "small")
    comps = _split(args.component, COMPONENTS, "component") or list(COMPONENTS)
    passes = "fwd" if args.inference else "fwd_bwd"
    decisions = []
    log_path = cache_path("select.log")
    with _library_output_to(log_path, console) as quiet:
        work = [(c, v) for c in comps for v in specs.get(c).variants]
        with _progress(quiet, len(work)) as progress:
            task = progress.add_task("selecting", total=len(work))
            for comp, variant in work:
                progress.update(task, description=f"{comp} [{variant}]")
                case = specs.get(comp).case(size, variant, dtype, device, fresh_seed())
                decisions.append(decide(comp, case.args, passes, remeasure=args.remeasure))
                progress.advance(task)
    which = "forward+backward" if passes == "fwd_bwd" else "forward"
    table = Table(title=f'level="auto" — {decisions[0].dtype}, {device}, size \'{size}\', decided by '
                        f"{which} time")
    for col in ("component", "variant", "shape class", "level", "verdict", "fwd ms", "fwd+bwd ms",
                "vs fastest", "why"):
        table.add_column(col, no_wrap=col != "why", min_width=24 if col == "why" else None)
    verdicts = {"unavailable": "[yellow]unavailable[/]", "interpreted": "[yellow]not a candidate[/]",
                "failed": "[red]failed check[/]", "error": "[red]error[/]"}
    for d in decisions:
        fastest = d.fastest_ms()
        for m in d.measurements:
            t = getattr(m, f"{passes}_ms")
            if m.level == d.level:
                verdict, why = "[bold green]chosen[/]", ("fastest" if t == fastest else
                                                         f"within {TIE:.0%} of the fastest, and a "
                                                         "lower rung")
            else:
                verdict, why = verdicts.get(m.status, "slower"), escape(m.reason)
            table.add_row(d.component, d.variant, d.shape_class, m.level, verdict,
                          f"{m.fwd_ms:.3g}" if m.fwd_ms else "—",
                          f"{m.fwd_bwd_ms:.3g}" if m.fwd_bwd_ms else "—",
                          f"{t / fastest:.2f}×" if t else "—", why)
        table.add_section()
    console.print(table)
    sources = sorted({d.source for d in decisions})
    console.print(f"measurements: {', '.join(sources)} (--remeasure to measure again)")
    return EXIT_OK


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
    if bad:
        return EXIT_FAILED
    return EXIT_OK if len(a.names) > 1 else EXIT_NOTHING_RAN  # the reference alone agrees with nothing


def cmd_explain(args, console) -> int:
    try:
        from .explain import explain
    except ModuleNotFoundError:
        console.print("explain is not available in this version")
        return EXIT_NOTHING_RAN
    text = explain(args.component, levels.resolve(args.level).name, _device(args.device))
    console.print(text, markup=False, highlight=False)
    unavailable = [s for s in getattr(text, "sections", ()) if s.title == "unavailable"]
    return EXIT_NOTHING_RAN if unavailable else EXIT_OK


def cmd_bench(args, console) -> int:
    from rich.table import Table

    from . import bench

    if args.suite:
        from .bench.suite import run_suite
        return run_suite(args, console)
    if args.overhead:
        from .overhead import run_overhead
        return run_overhead(args, console)
    if args.level or args.shapes or args.resume:
        raise ValueError("arguments '--level', '--shapes', '--resume' go with --suite (--level also "
                         "with --overhead)")
    args.out = args.out or "levels-reports"
    components = _split(args.component, COMPONENTS, "component")
    device = _device(args.device)
    if not device.startswith("cuda"):
        recorded = Path(__file__).resolve().parent.parent / "reports" / "h100-bench.json"
        where = recorded if recorded.exists() else "reports/h100-bench.json in the levels repository"
        console.print("levels bench: the speed goals are GPU figures (ratios against cuBLAS, cuDNN, "
                      "SDPA and copy bandwidth on an H100), and this run has no GPU, so nothing was "
                      f"timed or written. The recorded H100 results are in {where}; "
                      "`levels compare` and `levels profile` time the levels on this CPU.")
        return EXIT_NOTHING_RAN
    report = bench.run(components, device, args.out)
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
    from . import doctor, train
    from .grading import run_assignment, run_grade

    handler = {"check": cmd_check, "compare": cmd_compare, "profile": cmd_profile,
               "select": cmd_select, "agree": cmd_agree, "explain": cmd_explain,
               "bench": cmd_bench, "doctor": doctor.run, "train": train.run_train,
               "assignment": run_assignment,
               "grade": run_grade}[args.command]
    try:
        return handler(args, console)
    except NothingToRun as exc:
        console.print(f"levels {args.command}: {exc}", style="yellow", markup=False)
        return EXIT_NOTHING_RAN
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        console.print(f"levels {args.command}: {exc}", style="red", markup=False)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
