"""Level 5's forward-only calls on a GPU: under torch.no_grad, torch.inference_mode, or with
grad mode on and no input requiring a gradient, every component's op skips its autograd
Function (autograd.cpp's forward_only: no node, nothing packed) and must still compute the
same function: checked against the float64 reference, outputs requiring no gradient, the
running statistics of conv_bn's training mode updated as in a recorded call.
(tests/test_cuda_autograd_cpu.py runs the same check of autograd.cpp on a CPU, against torch
twins of the kernel ops.)"""

from __future__ import annotations

import contextlib

import pytest
import torch

import levels
from equivalence import cards, specs
from equivalence.check import clone_layout, compare, flatten
from equivalence.tolerances import tolerance
from levels.contract import COMPONENTS

pytestmark = pytest.mark.gpu


def _context(mode: str):
    return {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
            "nothing_requires_grad": contextlib.nullcontext}[mode]()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "nothing_requires_grad"])
@pytest.mark.parametrize("component", COMPONENTS)
def test_level5_forward_without_autograd(component, mode, dtype):
    fn = getattr(levels.get("cuda"), component)
    spec = specs.get(component)
    for variant in spec.variants:
        case = spec.case("tiny", variant, dtype, "cuda", torch.seed() % 2**31)
        ref = spec.reference({k: v.double() if isinstance(v, torch.Tensor) else v
                              for k, v in case.args.items()})
        grads = mode != "nothing_requires_grad"
        args = {k: clone_layout(v).requires_grad_(grads and k in case.differentiable)
                if isinstance(v, torch.Tensor) else v for k, v in case.args.items()}
        with _context(mode):
            outs = flatten(fn(**args)) + [args[m] for m in case.mutated]
        for name, got, want in zip(case.outputs, outs, ref):
            assert not got.requires_grad, f"{component}[{variant}] {name} requires grad"
            bound = cards.get(component).tolerance(dtype, tolerance(dtype))  # the harness's bound
            c = compare(name, got, want, bound, dtype)
            assert c.ok, f"{component}[{variant}] {mode}: {c}"
