"""`levels profile`: one component in depth, every level (equivalence/profile.py measures
each): steady state with its spread, first call, break-even, host time per call, memory,
achieved rates against this device's measured ceilings; plots and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import levels
from levels.contract import COMPONENTS

from .. import cards, environment, plots
from .. import ceilings as ceil
from ..check import fresh_seed, resolve_dtype
from ..profile import break_even_calls, profile, scaling, speedup_spread
from ..settings import CompileMode, compile_mode, default_dtype, default_size
from .console import (BREAK_EVEN_SAME, COMPILE_MODE_HELP, EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK,
                      HELP_FORMAT, Column, Sheet, fmt_break_even, fmt_first_call, fmt_ms, fmt_roof,
                      fmt_spread, library_output_to, log_note, progress, resolve_device, split_list)


def add_parser(sub) -> None:
    p = sub.add_parser("profile", formatter_class=HELP_FORMAT,
                       help="one component in depth: times, roofline, plots",
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
    p.add_argument("--remeasure", action="store_true",
                   help="measure this device's ceilings again instead of using the cached ones "
                        "(done anyway when a level lands above its roof)")
    p.set_defaults(run=run)


def above_matmul_roof(rows) -> bool:
    return any((r["throughput"].get(k) or {}).get("of_matmul", 0) > 1
               for r in rows for k in ("fwd", "fwd_bwd"))


def roof_warnings(rows: list[dict], component: str) -> list[str]:
    """A line for each fraction of a roof above 100%: never shown without saying why."""
    out = []
    for r in rows:
        for key, what in (("fwd", "forward"), ("fwd_bwd", "forward+backward")):
            tp = r["throughput"].get(key) or {}
            if tp.get("of_matmul", 0) > 1:
                out.append(f"{r['level']} {what} at {tp['of_matmul']:.0%} of the matmul roof: above "
                           f"it, so the roof is stale or was measured on a busy machine (it was "
                           f"measured again for this run); `levels profile --component {component} "
                           f"--remeasure` on a quiet machine")
            if tp.get("of_copy", 0) > 1:
                out.append(f"{r['level']} {what} at {tp['of_copy']:.0%} of the copy roof: its data "
                           f"fits in a cache the copy (sized past the last-level cache) does not, or "
                           f"the roof is stale (`--remeasure`)")
    return out


def print_table(rows: list[dict], settings: dict, env: dict, console) -> bool:
    """The profile's table; True if a level raised."""
    variant = f" [{settings['variant']}]" if settings.get("variant") else ""
    table = Sheet(f"levels profile — {settings['component']}{variant}, "
                  f"{settings['dtype']}, size '{settings['size']}', {env.get('gpu') or 'CPU'}",
                  ["level", Column("fwd ms\np20–p80", "right"),
                   Column("fwd+bwd ms\np20–p80", "right"), "first call",
                   Column("break-even", "right", under="first call"),
                   Column("host\nms/call", "right"),
                   Column("peak\nMB", "right", under="host\nms/call", optional=True),
                   Column("fwd+bwd\nTFLOP/s", "right"),
                   Column("fwd+bwd\nTB/s", "right", under="fwd+bwd\nTFLOP/s")])
    errors = False
    for r in rows:
        errors |= r["status"] == "error"
        tp = r["throughput"]["fwd_bwd"]
        table.add_row(r["level"], fmt_spread(r["fwd"]), fmt_spread(r["fwd_bwd"]), fmt_first_call(r),
                      fmt_break_even(r), fmt_ms(r["host"]),
                      f"{r['peak_memory_mb']:.1f}" if r["peak_memory_mb"] is not None else "—",
                      f"{tp['tflops']:.3g}\n{fmt_roof(tp.get('of_matmul'))} of matmul" if tp else "—",
                      f"{tp['tbps']:.3g}\n{fmt_roof(tp.get('of_copy'))} of copy" if tp else "—",
                      note=r["reason"] or r["notes"])
        table.add_section()
    table.print(console)
    if any(r.get("break_even_calls_vs_native") == "≈" for r in rows):
        console.print(BREAK_EVEN_SAME, markup=False, highlight=False)
    return errors


def run(args, console) -> int:
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype or default_dtype(device))
    size = args.size or default_size(device)
    card = cards.get(args.component)
    variant = args.variant or next(iter(card.variants))
    if variant not in card.variants:
        raise ValueError(f"argument '--variant' must be one of {sorted(card.variants)}; got {variant!r}")
    if size not in card.sizes:
        raise ValueError(f"argument '--size' must be one of {sorted(card.sizes)}; got {size!r}")
    names = [levels.resolve(n).name for n in split_list(args.level) or levels.LEVEL_NAMES]
    names = ["native"] + [n for n in names if n != "native"]  # the baseline, always
    seed = fresh_seed() if args.seed is None else args.seed
    out = Path(args.out)
    log_path = out / "profile.log"
    rows, points = [], []
    with library_output_to(log_path, console) as quiet, \
            CompileMode(compile_mode(args.compile_mode, device), device) as mode:
        steps = len(names) * (2 if args.scaling else 1) + 1
        with progress(quiet, steps) as bar:
            task = bar.add_task("measuring ceilings", total=steps)
            c = ceil.get(device, dtype, remeasure=args.remeasure)
            bar.advance(task)
            profiles = {}
            for name in names:
                bar.update(task, description=f"{args.component} · {name}")
                profiles[name] = profile(args.component, name, dtype, device, size, variant, seed,
                                         host_size="tiny", ceilings=c, trace_dir=args.trace)
                bar.advance(task)
            if above_matmul_roof(p.to_dict() for p in profiles.values()) and c.source != "measured now":
                # nothing beats the library's own GEMM: a cached roof under a level was
                # measured under load, or on other software; measure it again, once
                bar.update(task, description="measuring ceilings again")
                c = ceil.get(device, dtype, remeasure=True)
                for p in profiles.values():
                    p.ceilings = c.to_dict() if p.ceilings is not None else None
            for name in names:
                row = profiles[name].to_dict()
                row["break_even_calls_vs_native"] = (None if name == "native" else
                                                     break_even_calls(profiles[name], profiles["native"]))
                row["speedup_vs_native"] = (None if name == "native" else
                                            speedup_spread(profiles[name], profiles["native"]))
                rows.append(row)
            if args.scaling:
                for name in names:
                    bar.update(task, description=f"scaling · {name}")
                    if profiles[name].status == "ok":
                        points += scaling(args.component, name, dtype, device, size, variant, seed)[1]
                    bar.advance(task)
        env = environment.describe(device)
        settings = {"component": args.component, "levels": names, "dtype": rows[0]["dtype"],
                    "device": device, "size": size, "variant": variant, "seed": seed,
                    "compile_mode": mode.mode}
        stem = args.component
        files = [plots.levels_figure(rows, settings, env, out / f"profile-{stem}.png"),
                 plots.roofline_figure(rows, c.to_dict(), settings, env, out / f"roofline-{stem}.png")]
        if args.scaling:
            files.append(plots.scaling_figure(points, args.component, card.scaling_dim,
                                              settings, env, out / f"scaling-{stem}.png"))
        json_path = out / f"profile-{stem}.json"
        json_path.write_text(json.dumps({"environment": env, "settings": settings,
                                         "ceilings": c.to_dict(), "rows": rows,
                                         "scaling": points}, indent=2))

    errors = print_table(rows, settings, env, console)
    console.print(f"ceilings of this device ({c.source}, {c.measured}): copy {c.copy_tbps * 1e3:.3g} GB/s, "
                  f"{c.dtype} matmul {c.matmul_tflops:.3g} TFLOP/s. host ms/call: size 'tiny', calls "
                  "back to back: what one call costs the CPU, the floor under every time above.",
                  markup=False, highlight=False)
    for line in c.doubts + roof_warnings(rows, args.component):
        console.print(f"⚠ {line}", style="yellow", markup=False, highlight=False)
    traces = [r["trace"] for r in rows if r.get("trace")]
    if traces:
        console.print(f"Chrome traces (open in https://ui.perfetto.dev): {', '.join(traces)}")
    console.print(f"wrote {json_path}, {', '.join(str(f) for f in files)}; {log_note(log_path)}")
    if errors:
        return EXIT_FAILED
    return EXIT_OK if any(r["status"] == "ok" for r in rows) else EXIT_NOTHING_RAN
