"""What a timing comparison times: a level's function, or a library call, each prepared on
its own copy of the arguments.

`levels bench --suite models` puts each level beside the best library call at a model's
shape, `levels bench --overhead` beside the eager one; both time `Impl`s. A card says which
library calls its component is measured against (`libraries`, `eager` on the card);
`level_impl` makes the same kind of side of a level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

import levels

from . import cards
from .check import flatten


@dataclass
class Impl:
    """One side of a comparison. `prepare(args)` gets this side's own copy of the arguments
    (differentiable ones requiring grad in a training pass) and returns (call, inputs):
    `call()` runs it and returns its outputs as a flat list, `inputs` are the tensors the
    backward differentiates. `context` is entered around all of its calls (SDPA's backend
    pin: entered once, so its few microseconds of Python are not timed)."""
    name: str
    kind: str  # "level" or "library"
    prepare: Callable[[dict], tuple[Callable[[], list], list]]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    tf32: bool = False  # whether its fp32 math runs in TF32 (its agreement bound)


def differentiable(component: str, args: dict) -> list:
    """The tensors of `args` the card says a backward differentiates."""
    return [args[n] for n in cards.get(component).differentiable
            if isinstance(args.get(n), torch.Tensor)]


def level_impl(name: str, component: str, device, dtype) -> Impl:
    module = levels.get(name)
    fn = getattr(module, component)

    def prepare(args):
        return (lambda: flatten(fn(**args))), differentiable(component, args)

    return Impl(name, "level", prepare, tf32=bool(module.uses_tf32(component, device, dtype)))


def own_args(args: dict, component: str, training: bool) -> dict:
    """A side's own copy: running statistics it may update, leaves with their own grads."""
    wants = set(cards.get(component).differentiable) if training else set()
    return {k: (v.detach().clone().requires_grad_(k in wants) if isinstance(v, torch.Tensor) else v)
            for k, v in args.items()}


def upstream(outs: list, seed: int = 0) -> list:
    """The same upstream gradients for every side: drawn on the CPU from one seed (the same
    numbers on every device)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g).to(device=o.device, dtype=o.dtype) for o in outs]
