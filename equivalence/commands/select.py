"""`levels select`: the table behind level="auto" (equivalence/select.py decides)."""

from __future__ import annotations

from rich.markup import escape

from levels.contract import COMPONENTS

from .. import cards
from ..check import fresh_seed, resolve_dtype
from ..select import TIE, as_fast, decide
from ..settings import current, default_dtype, default_size
from .console import (EXIT_OK, HELP_FORMAT, Column, Sheet, library_output_to, progress, resolve_device,
                      split_list)


def add_parser(sub) -> None:
    p = sub.add_parser("select", formatter_class=HELP_FORMAT,
                       help='which level level="auto" picks, and why',
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
    p.set_defaults(run=run)


def print_table(decisions, device, size, passes, console) -> None:
    which = "forward+backward" if passes == "fwd_bwd" else "forward"
    table = Sheet(f'level="auto" — {decisions[0].dtype}, {device}, size \'{size}\', decided by '
                  f"{which} time",
                  [Column("component"), Column("variant", under="component"), "shape class", "level",
                   Column("verdict", under="level"), Column("fwd ms", "right"),
                   Column("fwd+bwd ms", "right", under="fwd ms"), Column("vs\nfastest", "right")],
                  note="why")
    verdicts = {"unavailable": "[yellow]unavailable[/]", "interpreted": "[yellow]not a candidate[/]",
                "failed": "[red]failed check[/]", "error": "[red]error[/]"}
    for d in decisions:
        best = d.fastest()
        fastest = getattr(best, f"{passes}_ms")
        for m in d.measurements:
            t = getattr(m, f"{passes}_ms")
            if m.status == "ok":
                lo, hi = m.spread(passes)
                spread = f"p20–p80 {lo:.3g}–{hi:.3g} ms"
            if m.level == d.level:
                verdict = "[bold green]chosen[/]"
                if m is best:
                    why = "fastest"
                elif t <= fastest * (1 + TIE):
                    why = f"within {TIE:.0%} of the fastest, and a lower rung"
                else:
                    why = (f"as fast as the fastest ({best.level}) as far as the timing can tell "
                           f"({spread} overlaps its {best.spread(passes)[0]:.3g}–"
                           f"{best.spread(passes)[1]:.3g} ms), and a lower rung")
            elif m.status == "ok" and as_fast(m, best, passes):
                # no verdict the next run could reverse: the intervals overlap
                verdict, why = "≈ as fast", f"{spread}: as fast as the timing can tell; a higher rung"
            elif m.status == "ok":
                verdict, why = "slower", f"{spread}, above the fastest's"
            else:
                verdict, why = verdicts.get(m.status, "slower"), m.reason
            table.add_row(d.component, d.variant, escape(d.shape_class), m.level, verdict,
                          f"{m.fwd_ms:.3g}" if m.fwd_ms else "—",
                          f"{m.fwd_bwd_ms:.3g}" if m.fwd_bwd_ms else "—",
                          f"{t / fastest:.2f}×" if t else "—", note=why)
        table.add_section()
    table.print(console)


def run(args, console) -> int:
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype or default_dtype(device))
    size = args.size or default_size(device)
    comps = split_list(args.component, COMPONENTS, "component") or list(COMPONENTS)
    passes = "fwd" if args.inference else "fwd_bwd"
    settings = current()
    decisions = []
    log_path = settings.cache_path("select.log")
    with library_output_to(log_path, console) as quiet:
        work = [(c, v) for c in comps for v in cards.get(c).variants]
        with progress(quiet, len(work)) as bar:
            task = bar.add_task("selecting", total=len(work))
            for comp, variant in work:
                bar.update(task, description=f"{comp} [{variant}]")
                case = cards.get(comp).case(size, variant, dtype, device, fresh_seed())
                decisions.append(decide(comp, case.args, passes, remeasure=args.remeasure,
                                        settings=settings))
                bar.advance(task)
    print_table(decisions, device, size, passes, console)
    sources = sorted({d.source for d in decisions})
    console.print(f"measurements: {', '.join(sources)} (--remeasure to measure again)")
    return EXIT_OK
