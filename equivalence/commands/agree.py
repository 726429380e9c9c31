"""`levels agree`, level against level: do any two levels agree with each other as well as with the truth?

For one component, every available level runs forward and backward on the *same* inputs
with the *same* upstream gradient; the matrix entry (a, b) is the worst relative
difference over all outputs and gradients,  max_t ||a_t - b_t|| / ||b_t||.  The float64
reference is included as the first row/column, so the diagonal band shows how far each
level is from the truth and the rest how far levels are from one another.

The registered levels (`levels.register`) are in it after the five, and your own functions
join it by name: `agreement("layer_norm", fns={"mine": my_layer_norm})` (each behind the
contract's validator, like a level).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rich.markup import escape

import levels

from .. import cards
from ..check import (AGREEMENT_REFERENCE, _open, fresh_seed, own_targets, poisoned_allocations,
                     reference_case, resolve_dtype, run_case)
from .console import (EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, HELP_FORMAT, Column, Sheet, fmt_err,
                      resolve_device)

REFERENCE = AGREEMENT_REFERENCE


@dataclass
class Agreement:
    component: str
    variant: str
    dtype: str
    names: list[str]
    matrix: list[list[float]]
    skipped: dict[str, str]
    seed: int


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300))


def agreement(component: str, dtype="float32", device="cpu", size="tiny", variant=None,
              level_names=None, seed=None, *, fns: dict | None = None) -> Agreement:
    """The matrix of `level_names` (default: the five levels, then the registered ones),
    followed by your functions `fns` ({name: function}), against the reference and each
    other. A level that cannot run here, or raises, is left out with the reason in
    `skipped`."""
    card = cards.get(component)
    variant = variant or next(iter(card.variants))
    dtype = resolve_dtype(dtype)
    seed = fresh_seed() if seed is None else seed
    names = [levels.resolve(name).name for name in level_names or levels.names()]
    targets = names + own_targets(component, fns)
    case = card.case(size, variant, dtype, torch.device(device), seed)
    ref_outs, ref_grads, upstream, _ = reference_case(case, seed)
    results = {REFERENCE: ref_outs + ref_grads}
    skipped = {}
    for target in targets:
        name, reason, module = _open(target, torch.device(device), component)
        if reason:
            skipped[name] = reason
            continue
        try:
            with poisoned_allocations():
                outs, grads = run_case(getattr(module, component), case, upstream)
        except Exception as exc:  # noqa: BLE001
            skipped[name] = f"raised {type(exc).__name__}: {exc}"
            continue
        if len(outs) != len(ref_outs):  # zip would compare the first few and call it agreement
            skipped[name] = f"returned {len(outs)} outputs, expected {len(ref_outs)}"
            continue
        if any(g is None for g in grads):
            missing = [n for n, g in zip(case.differentiable, grads) if g is None]
            skipped[name] = f"no gradient for {', '.join(missing)} (input unused by the graph)"
            continue
        results[name] = outs + grads
    names = list(results)
    matrix = [[max(_rel(a, b) for a, b in zip(results[r], results[c])) for c in names]
              for r in names]
    return Agreement(component, variant, str(dtype).replace("torch.", ""), names, matrix, skipped,
                     seed)


def add_parser(sub) -> None:
    p = sub.add_parser("agree", formatter_class=HELP_FORMAT,
                       help="level-vs-level agreement matrix",
                       description="Relative difference between every pair of levels (and the float64 "
                                   "reference) on the same inputs, worst over outputs and gradients.")
    p.add_argument("--component", required=True, choices=cards.names())
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device")
    p.add_argument("--size", default="tiny")
    p.add_argument("--variant")
    p.add_argument("--seed", type=int)
    p.set_defaults(run=run)


def print_table(a: Agreement, console) -> None:
    table = Sheet(f"{a.component} [{a.variant}] {a.dtype}: max relative difference "
                  f"(row vs column), seed {a.seed}",
                  [Column("")] + [Column(n.replace(" ", "\n"), "right") for n in a.names])
    for n, row in zip(a.names, a.matrix):
        table.add_row(n, *[fmt_err(x) if x else "0" for x in row])
    table.print(console)
    for name, reason in a.skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {escape(reason)}")


def run(args, console) -> int:
    a = agreement(args.component, args.dtype, resolve_device(args.device), args.size, args.variant,
                  seed=args.seed)
    print_table(a, console)
    bad = any(x != x for row in a.matrix for x in row)
    if bad:
        return EXIT_FAILED
    # the reference alone agrees with nothing
    return EXIT_OK if len(a.names) > 1 else EXIT_NOTHING_RAN
