"""swiglu_mlp speed goal (issue 30): bf16, Levels 4 (Triton) and 5 (CUDA C++, the best
version of gemm.cu this GPU has) >= 0.9x eager PyTorch (three cuBLAS GEMMs, SiLU and the
product as kernels of their own: HF LlamaMLP's forward), forward and forward+backward, at
Llama 2 7B's and Llama 3 8B's MLP shapes (the card's MODEL_SHAPES of those names: 4096 ->
11008 and 4096 -> 14336; one 4096-token sequence each, so both run in a few seconds).

Each level is called through its contract function; the baseline is timed in the same run,
in rounds with the levels (goals.figures_in_rounds): GEMMs this long lower the H100's clock
within seconds, so a side timed first, on a cooler GPU, would be favoured."""

from __future__ import annotations

import sys

import torch

import levels
from ... import cards

from .goals import figures_in_rounds

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
    here = _levels_here(device)
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

        def forward(fn):
            def go():
                with torch.no_grad():
                    fn(*tensors)
            return go

        for what, wrap, fl, notes in (
                ("forward", forward, flops["fwd"], "eager: 3 cuBLAS GEMMs + silu + mul"),
                ("forward+backward", step, flops["fwd"] + flops["bwd"],
                 "eager: cuBLAS + silu + mul, autograd")):
            specs = [dict(component="swiglu_mlp", name=f"{what} {shape.name}", level="native",
                          dtype=dtype, shape=shp, fn=wrap(native.swiglu_mlp), flops=fl,
                          notes=notes)]
            specs += [dict(component="swiglu_mlp", name=f"{what} {shape.name}", level=level,
                           dtype=dtype, shape=shp, fn=wrap(getattr(levels.get(level), "swiglu_mlp")),
                           flops=fl, baseline=BASELINE, against=0, goal=GOAL) for level in here]
            figs += figures_in_rounds(specs, device)
    return figs
