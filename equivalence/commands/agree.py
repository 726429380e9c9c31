"""Level against level: do any two levels agree with each other as well as with the truth?

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

import levels

from . import specs
from .check import _open, fresh_seed, poisoned_allocations, reference_case, resolve_dtype, run_case

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


def _is_level(name: str) -> bool:
    try:
        levels.resolve(name)
    except ValueError:
        return False
    return True


def own_targets(component: str, fns) -> list:
    """`fns` ({name: function}) as OwnLevels named by their keys (never a level's name)."""
    if fns is None:
        return []
    if not isinstance(fns, dict):
        raise TypeError(f"argument 'fns' must be a dict {{name: function}}; "
                        f"got {type(fns).__name__}")
    targets = []
    for name, fn in fns.items():
        if not isinstance(name, str) or not name.strip() or name == REFERENCE or _is_level(name):
            raise ValueError(f"argument 'fns': each name must be a non-empty str that names no "
                             f"level (those run by their name); got {name!r}")
        targets.append(levels.own(component, fn, name=name))
    return targets


def agreement(component: str, dtype="float32", device="cpu", size="tiny", variant=None,
              level_names=None, seed=None, *, fns: dict | None = None) -> Agreement:
    """The matrix of `level_names` (default: the five levels, then the registered ones),
    followed by your functions `fns` ({name: function}), against the reference and each
    other. A level that cannot run here, or raises, is left out with the reason in
    `skipped`."""
    spec = specs.get(component)
    variant = variant or next(iter(spec.variants))
    dtype = resolve_dtype(dtype)
    seed = fresh_seed() if seed is None else seed
    names = [levels.resolve(name).name for name in level_names or levels.names()]
    targets = names + own_targets(component, fns)
    case = spec.case(size, variant, dtype, torch.device(device), seed)
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
