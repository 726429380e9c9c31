"""One spec per component: what to feed it, what it must compute, and what a call costs.

A spec module (`equivalence/specs/<component>.py`) defines

    SIZES          preset name -> shape parameters: 'tiny' (tests, interpreters),
                   'small' (CPU runs), 'bench' (the GPU), sometimes more
    VARIANTS       variant name -> non-tensor keyword arguments (causal, training, ...)
    OUTPUTS        names of the flattened outputs, in order
    DIFFERENTIABLE the arguments whose gradients are checked
    MUTATED        variant -> buffers the call updates in place (checked like outputs)
    STRIDED        argument -> how the `strided` layout stores it (see LAYOUT_KINDS); a spec
                   may instead define strided(args) -> args itself (attention: q, k, v
                   sliced from one packed (B, N, 3, H, D) buffer)
    zero_gradient_scales(args, upstream, grads) -> {input: tensor} (optional): for inputs
                   whose gradient is exactly zero on these arguments, the tensor whose norm
                   the level's (rounding-sized) gradient is measured against instead
    make_args(shape, dtype, device, generator) -> dict of arguments, in signature order
    reference(**args) -> tuple of float64 outputs, written from the math (never by
                   calling a level), then the new values of the MUTATED buffers
    flops(args) / min_bytes(args) -> {'fwd': ..., 'bwd': ...} for one call

`Spec` wraps such a module with the generic parts (sizes and variants by name, seeding,
layouts).

Layouts. A level receives whatever tensors a user has, and a user's tensors are often views:
a bias sliced from a fused parameter buffer, a weight stored transposed, activations sliced
from a bigger buffer, channels_last images, q/k/v cut out of one projection. Every case is
therefore run in two layouts: `contiguous` (fresh tensors) and `strided` (the same values,
every tensor argument a view). The memory a strided view does not cover is filled with NaN,
so a kernel that reads between the elements (indexing as if the stride were 1) computes NaN
and fails, and `check` verifies that those bytes are unchanged after the call, so a kernel
that writes between them fails too. Around a buffer the call updates in place the filler
is a finite sentinel (GAP_SENTINEL) instead: arithmetic on a NaN can give back the very
same NaN bytes, which would hide a write; on a sentinel it cannot.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from levels.contract import COMPONENTS


LAYOUTS = ("contiguous", "strided")


@dataclass(frozen=True)
class Case:
    """One concrete call: a component at a size, variant and layout, with fresh inputs."""
    component: str
    size: str
    variant: str
    args: dict
    differentiable: tuple[str, ...]
    mutated: tuple[str, ...]
    outputs: tuple[str, ...]
    layout: str = "contiguous"  # "strided": every tensor argument is a view (see above)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.tensors().values())).dtype

    @property
    def n_returned(self) -> int:
        """How many of `outputs` the call returns (the rest are buffers it updates)."""
        return len(self.outputs) - len(self.mutated)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.args.items() if isinstance(v, torch.Tensor)}

    def shapes(self) -> dict[str, tuple]:
        return {k: tuple(v.shape) for k, v in self.tensors().items()}


class Spec:
    def __init__(self, module: ModuleType):
        self.name = module.__name__.rsplit(".", 1)[1]
        self.module = module
        self.sizes: dict[str, dict] = module.SIZES
        self.variants: dict[str, dict] = module.VARIANTS
        self.outputs: tuple[str, ...] = tuple(module.OUTPUTS)
        self.differentiable: tuple[str, ...] = tuple(module.DIFFERENTIABLE)

    def case(self, size: str | dict, variant: str, dtype: torch.dtype, device, seed: int,
             layout: str = "contiguous") -> Case:
        """Fresh random inputs for a size preset (or a dict of shape parameters), variant and
        layout. Both layouts hold the same values for the same seed."""
        if isinstance(size, dict):
            shape, size = size, "custom"
        elif size in self.sizes:
            shape = self.sizes[size]
        else:
            raise ValueError(f"argument 'size' must be one of {sorted(self.sizes)} for {self.name} "
                             f"(or a dict of shape parameters); got {size!r}")
        if variant not in self.variants:
            raise ValueError(f"argument 'variant' must be one of {sorted(self.variants)} for "
                             f"{self.name}; got {variant!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"argument 'layout' must be one of {', '.join(LAYOUTS)}; got {layout!r}")
        generator = torch.Generator(device="cpu").manual_seed(seed)
        args = self.module.make_args(shape, dtype, torch.device(device), generator)
        args.update(self.variants[variant])
        if layout == "strided":
            args = self.strided(args, self.module.MUTATED.get(variant, ()))
        return self.case_from_args(args, size, layout)

    def strided(self, args: dict, mutated=()) -> dict:
        """The same values with every tensor argument a view (the spec's STRIDED kinds)."""
        own = getattr(self.module, "strided", None)
        if own is not None:
            return own(dict(args))
        kinds = self.module.STRIDED
        return {name: as_view(value, kinds[name], GAP_SENTINEL if name in mutated else float("nan"))
                if isinstance(value, torch.Tensor) else value for name, value in args.items()}

    def case_from_args(self, args: dict, size: str = "custom", layout: str | None = None) -> Case:
        """A case made of arguments you choose (any shapes, strides or layouts). The variant
        follows from the flags in `args` (a missing flag counts as False)."""
        variant = next((name for name, flags in self.variants.items()
                        if all(bool(args.get(k, False)) == v for k, v in flags.items())), None)
        if variant is None:
            raise ValueError(f"{self.name}: the arguments match no variant of {sorted(self.variants)}")
        mutated = tuple(self.module.MUTATED.get(variant, ()))
        differentiable = tuple(n for n in self.differentiable if isinstance(args.get(n), torch.Tensor))
        if layout is None:
            contiguous = all(t.is_contiguous() for t in args.values() if isinstance(t, torch.Tensor))
            layout = "contiguous" if contiguous else "strided"
        return Case(self.name, size, variant, dict(args), differentiable, mutated,
                    self.outputs + mutated, layout)

    def zero_gradient_scales(self, args: dict, upstream, grads: dict) -> dict:
        fn = getattr(self.module, "zero_gradient_scales", None)
        return {} if fn is None else {k: v.detach() for k, v in fn(args, upstream, grads).items()}

    def reference(self, args: dict) -> tuple[torch.Tensor, ...]:
        return tuple(self.module.reference(**args))

    def flops(self, args: dict) -> dict[str, int]:
        return self.module.flops(args)

    def min_bytes(self, args: dict) -> dict[str, int]:
        return self.module.min_bytes(args)


def randn(shape, generator, dtype, device, scale=1.0, shift=0.0) -> torch.Tensor:
    """Draw on the CPU in float32 (same numbers on every device), then cast and move."""
    t = torch.randn(shape, generator=generator, dtype=torch.float32) * scale + shift
    return t.to(device=device, dtype=dtype)


def uniform(shape, generator, dtype, device, low, high) -> torch.Tensor:
    t = torch.rand(shape, generator=generator, dtype=torch.float32) * (high - low) + low
    return t.to(device=device, dtype=dtype)


# How the `strided` layout stores one argument. Each kind is a layout users really pass.
LAYOUT_KINDS = {
    "every_other": "a 1-D view with stride 2 (one parameter of a fused, interleaved buffer)",
    "last_every_other": "stride 2 along the last dimension",
    "transposed": "a 2-D weight stored column-major (w.t() of a contiguous tensor)",
    "row_padded": "rows sliced out of a wider buffer (row stride > width, offset 1)",
    "time_major": "(B, T, I) as a permuted view of a (T, B, I) buffer",
    "channels_last": "a 4-D tensor in torch.channels_last",
}


# Between the elements of a strided buffer that a call updates in place (exact in fp16/bf16).
GAP_SENTINEL = -4096.0


def as_view(t: torch.Tensor, kind: str, gap: float = float("nan")) -> torch.Tensor:
    """A view laid out as LAYOUT_KINDS[kind] holding exactly t's values, `gap` in the
    memory around it (NaN: reading there poisons the result)."""
    def _gapped(shape, dtype, device):
        return torch.full(shape, gap, dtype=dtype, device=device)

    if kind not in LAYOUT_KINDS:
        raise ValueError(f"unknown layout kind {kind!r}; one of {sorted(LAYOUT_KINDS)}")
    view = None
    if kind == "every_other" and t.dim() == 1:
        view = _gapped((2 * t.numel(),), t.dtype, t.device)[::2]
    elif kind == "last_every_other":
        view = _gapped((*t.shape[:-1], 2 * t.shape[-1]), t.dtype, t.device)[..., ::2]
    elif kind == "transposed":
        view = _gapped(tuple(reversed(t.shape)), t.dtype, t.device).t()
    elif kind == "row_padded":
        view = _gapped((*t.shape[:-1], t.shape[-1] + 3), t.dtype, t.device)[..., 1:t.shape[-1] + 1]
    elif kind == "time_major":
        view = _gapped((t.shape[1], t.shape[0], *t.shape[2:]), t.dtype, t.device).transpose(0, 1)
    elif kind == "channels_last" and t.dim() == 4:
        view = torch.empty_like(t, memory_format=torch.channels_last)
    if view is None or tuple(view.shape) != tuple(t.shape):
        raise ValueError(f"layout kind {kind!r} does not apply to a tensor of shape {tuple(t.shape)}")
    return view.copy_(t)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def get(component: str) -> Spec:
    if component not in COMPONENTS:
        raise ValueError(f"argument 'component' must be one of {', '.join(COMPONENTS)}; "
                         f"got {component!r}")
    return Spec(importlib.import_module(f"{__name__}.{component}"))


__all__ = ["LAYOUTS", "LAYOUT_KINDS", "Case", "Spec", "as_view", "get", "nbytes", "randn",
           "uniform"]
