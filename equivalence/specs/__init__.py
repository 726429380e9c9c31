"""One spec per component: what to feed it, what it must compute, and what a call costs.

A spec module (`equivalence/specs/<component>.py`) defines

    SIZES          preset name -> shape parameters: 'tiny' (tests, interpreters),
                   'small' (CPU runs), 'bench' (the GPU), sometimes more
    VARIANTS       variant name -> non-tensor keyword arguments (causal, training, ...)
    OUTPUTS        names of the flattened outputs, in order
    DIFFERENTIABLE the arguments whose gradients are checked
    MUTATED        variant -> buffers the call updates in place (checked like outputs)
    zero_gradient_scales(args, upstream, grads) -> {input: tensor} (optional): for inputs
                   whose gradient is exactly zero on these arguments, the tensor whose norm
                   the level's (rounding-sized) gradient is measured against instead
    make_args(shape, dtype, device, generator) -> dict of arguments, in signature order
    reference(**args) -> tuple of float64 outputs, written from the math (never by
                   calling a level), then the new values of the MUTATED buffers
    flops(args) / min_bytes(args) -> {'fwd': ..., 'bwd': ...} for one call

`Spec` wraps such a module with the generic parts (sizes and variants by name, seeding).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from levels.contract import COMPONENTS


@dataclass(frozen=True)
class Case:
    """One concrete call: a component at a size and variant, with fresh inputs."""
    component: str
    size: str
    variant: str
    args: dict
    differentiable: tuple[str, ...]
    mutated: tuple[str, ...]
    outputs: tuple[str, ...]

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

    def case(self, size: str | dict, variant: str, dtype: torch.dtype, device, seed: int) -> Case:
        """Fresh random inputs for a size preset (or a dict of shape parameters) and variant."""
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
        generator = torch.Generator(device="cpu").manual_seed(seed)
        args = self.module.make_args(shape, dtype, torch.device(device), generator)
        args.update(self.variants[variant])
        return self.case_from_args(args, size)

    def case_from_args(self, args: dict, size: str = "custom") -> Case:
        """A case made of arguments you choose (any shapes, strides or layouts). The variant
        follows from the flags in `args` (a missing flag counts as False)."""
        variant = next((name for name, flags in self.variants.items()
                        if all(bool(args.get(k, False)) == v for k, v in flags.items())), None)
        if variant is None:
            raise ValueError(f"{self.name}: the arguments match no variant of {sorted(self.variants)}")
        mutated = tuple(self.module.MUTATED.get(variant, ()))
        differentiable = tuple(n for n in self.differentiable if isinstance(args.get(n), torch.Tensor))
        return Case(self.name, size, variant, dict(args), differentiable, mutated,
                    self.outputs + mutated)

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


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def get(component: str) -> Spec:
    if component not in COMPONENTS:
        raise ValueError(f"argument 'component' must be one of {', '.join(COMPONENTS)}; "
                         f"got {component!r}")
    return Spec(importlib.import_module(f"{__name__}.{component}"))


__all__ = ["Case", "Spec", "get", "nbytes", "randn", "uniform"]
