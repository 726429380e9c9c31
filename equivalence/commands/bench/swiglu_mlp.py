"""swiglu_mlp speed goal (issue 30): bf16, Levels 4 (Triton) and 5 (CUDA C++, the best
version of gemm.cu this GPU has) >= 0.9x eager PyTorch (three cuBLAS GEMMs, SiLU and the
product as kernels of their own: HF LlamaMLP's forward), forward and forward+backward, at
Llama 2 7B's and Llama 3 8B's MLP shapes (the card's MODEL_SHAPES of those names: 4096 ->
11008 and 4096 -> 14336; one 4096-token sequence each, so both run in a few seconds).

Each level is called through its contract function; the baseline is timed in the same run."""

from __future__ import annotations

import sys

import torch

import levels
from ... import cards

from .goals import figure

SHAPES = ("llama2-7b-train", "llama3-8b-train")
TOKENS = 4096
GOAL = 0.9
BASELINE = "eager PyTorch (cuBLAS GEMMs + SiLU + mul)"
NAMES = ("x", "w_gate", "w_up", "w_down")


def _levels_here(device) -> list[str]:
    here = []
    for level in ("triton", "cuda"):
        reason = levels.status(level, device, "swiglu_mlp")
        if reason:
            print(f"swiglu_mlp bench: {level} skipped: {reason}", file=sys.stderr)
        else:
            here.append(level)
    return here


def run(device) -> list:
    device = torch.device(device)
    card = cards.get("swiglu_mlp")
    dtype = torch.bfloat16
    native = levels.get("native")
    figs = []
    for shape in (s for s in card.model_shapes if s.name in SHAPES):
        sizes = dict(shape.sizes, rows=(1, TOKENS))
        args = card.module.make_args(sizes, dtype, device, torch.Generator().manual_seed(0))
        flops = card.flops(args)
        tensors = [args[n] for n in NAMES]
        shp = {"M": TOKENS, "K": sizes["K"], "hidden": sizes["hidden"], "N": sizes["N"],
               "shape": shape.name}
        leaves = [t.detach().requires_grad_(True) for t in tensors]
        dy = torch.randn((1, TOKENS, sizes["N"]), device=device, dtype=dtype)

        def step(fn):
            def go():
                torch.autograd.grad(fn(*leaves), leaves, dy)
            return go

        with torch.no_grad():
            base_f = figure("swiglu_mlp", f"forward {shape.name}", "native", dtype, shp,
                            lambda: native.swiglu_mlp(*tensors), device, flops=flops["fwd"],
                            notes="eager: 3 cuBLAS GEMMs + silu + mul")
        base_fb = figure("swiglu_mlp", f"forward+backward {shape.name}", "native", dtype, shp,
                         step(native.swiglu_mlp), device, flops=flops["fwd"] + flops["bwd"],
                         notes="eager: cuBLAS + silu + mul, autograd")
        figs += [base_f, base_fb]
        for level in _levels_here(device):
            fn = getattr(levels.get(level), "swiglu_mlp")
            for what, go, fl, base, grad in (
                    ("forward", lambda fn=fn: fn(*tensors), flops["fwd"], base_f, False),
                    ("forward+backward", step(fn), flops["fwd"] + flops["bwd"], base_fb, True)):
                try:
                    with torch.set_grad_enabled(grad):
                        figs.append(figure("swiglu_mlp", f"{what} {shape.name}", level, dtype, shp,
                                           go, device, flops=fl, baseline=BASELINE,
                                           baseline_ms=base.ms, goal=GOAL))
                except Exception as exc:  # noqa: BLE001 - one failing level must not hide the other
                    print(f"swiglu_mlp bench: {level} {what} {shape.name} failed: "
                          f"{type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
    return figs
