"""Level against level: do any two levels agree with each other as well as with the truth?

For one component, every available level runs forward and backward on the *same* inputs
with the *same* upstream gradient; the matrix entry (a, b) is the worst relative
difference over all outputs and gradients,  max_t ||a_t - b_t|| / ||b_t||.  The float64
reference is included as the first row/column, so the diagonal band shows how far each
level is from the truth and the rest how far levels are from one another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import levels

from . import specs
from .check import fresh_seed, poisoned_allocations, reference_case, resolve_dtype, run_case

REFERENCE = "float64 reference"


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
              level_names=None, seed=None) -> Agreement:
    spec = specs.get(component)
    variant = variant or next(iter(spec.variants))
    dtype = resolve_dtype(dtype)
    seed = fresh_seed() if seed is None else seed
    case = spec.case(size, variant, dtype, torch.device(device), seed)
    ref_outs, ref_grads, upstream, _ = reference_case(case, seed)
    results = {REFERENCE: ref_outs + ref_grads}
    skipped = {}
    for name in level_names or levels.LEVEL_NAMES:
        name = levels.resolve(name).name
        reason = levels.status(name, device, component)
        if reason:
            skipped[name] = reason
            continue
        try:
            with poisoned_allocations():
                outs, grads = run_case(getattr(levels.get(name), component), case, upstream)
        except Exception as exc:  # noqa: BLE001
            skipped[name] = f"raised {type(exc).__name__}: {exc}"
            continue
        results[name] = outs + grads
    names = list(results)
    matrix = [[max(_rel(a, b) for a, b in zip(results[r], results[c])) for c in names]
              for r in names]
    return Agreement(component, variant, str(dtype).replace("torch.", ""), names, matrix, skipped,
                     seed)
