"""newton_schulz speed goals (issue #31), bf16 on an H100:

- Levels 4 and 5 at >= 1.4x native (Level 1's three GEMMs and three pointwise passes a
  step) at 1024x1024, 4096x4096, 4096x11008, and on the parameter lists of GPT-2 small and
  Llama 2 7B (each 2-D weight orthogonalized once per Muon step: the whole list timed as
  one figure, as an optimizer step sees it). A list is timed as levels.optim.Muon runs it:
  the weights grouped by shape, one batched call per group on a (B, rows, cols) stack, at
  every level, against the baseline "native loop": Level 1 called once per weight (what
  Muon did before it batched). Level 1's own grouped figure says what batching alone buys;
  each kernel level's extra["vs_native_batched"] is its ratio to that figure. The lists:
  GPT-2 small's whole model (12 blocks: 4 shapes, 12 of each) and Llama 2 7B's one block
  (3 shapes, 7 weights: the whole model, 32 blocks, is ~7e14 FLOPs a step, seconds per
  call at Level 5's CUDA-core rung; LLAMA_BLOCKS scales it);
- the symmetric X X^T kernel (triton_kernels/newton_schulz.symmetric_product, one triangle
  of tiles launched and mirrored) >= 1.5x torch.matmul(X, X.T) at 4096 and 8192 (X of 4096
  columns, bf16).

Level 5's other versions are timed beside its default at the square shapes (`v1 4096x4096`
...: the ladder side by side; version 1, on the CUDA cores, at 1024x1024 only).

Kernel time (equivalence.timing, prime=True): Level 4's and 5's 2 + 3 * steps launches are
short against their host work at 1024^2. Figures without a goal, for scale: Muon's own addmm
iteration (the card's library call) and torch.compile of the Level 1 math."""

from __future__ import annotations

import torch

import levels
from ... import cards

from .goals import Figure, figure

PRIME = True
GOAL = 1.4  # Levels 4 and 5 over native
SYMMETRIC_GOAL = 1.5  # the symmetric kernel over torch.matmul(X, X.T)
SQUARE = ((1024, 1024), (4096, 4096), (4096, 11008))
LLAMA_BLOCKS = 1  # Llama 2 7B has 32; see the module doc
PARAMETER_LISTS = {  # ((rows, cols), how many) of a model's 2-D weights, as nn.Linear stores them
    "gpt2-small 12 blocks": (((2304, 768), 12), ((768, 768), 12), ((3072, 768), 12),
                             ((768, 3072), 12)),
    f"llama2-7b {LLAMA_BLOCKS} block": (((4096, 4096), 4 * LLAMA_BLOCKS),
                                        ((11008, 4096), 2 * LLAMA_BLOCKS),
                                        ((4096, 11008), LLAMA_BLOCKS)),
}
KERNEL_LEVELS = ("triton", "cuda")
CUDA_CORE_LIMIT = 1024 * 1024  # elements: Level 5's version 1 is timed up to this size


def _matrices(shapes, dtype, device):
    g = torch.Generator().manual_seed(0)
    return [cards.randn(s, g, dtype, device) for s in shapes]


def _over_list(fn, Gs):
    def go():
        for G in Gs:
            fn(G)
    return go


def _levels_figures(name, shapes, Gs, dtype, device) -> list:
    card = cards.get("newton_schulz")
    flops = sum(card.flops({"G": G, "steps": 5})["fwd"] for G in Gs)
    shape = {"shapes": [list(s) for s in shapes]}
    native = figure("newton_schulz", name, "native", dtype, shape,
                    _over_list(levels.get("native").newton_schulz, Gs), device, flops=flops,
                    prime=PRIME, notes="three cuBLAS GEMMs + three pointwise passes a step")
    figs = [native]
    for level in ("compile",) + KERNEL_LEVELS:
        reason = levels.status(level, device, "newton_schulz")
        if reason:
            figs.append(figure_skip(name, level, dtype, shape, reason))
            continue
        fn = levels.get(level).newton_schulz
        figs.append(figure("newton_schulz", name, level, dtype, shape, _over_list(fn, Gs), device,
                           flops=flops, baseline="native", baseline_ms=native.ms,
                           goal=GOAL if level in KERNEL_LEVELS else None, prime=PRIME))
        if level == "cuda":
            figs += _cuda_versions(name, shape, Gs, dtype, device, flops, native.ms)
    lib = card.libraries(device, dtype)[0]
    calls = [lib.prepare(dict(G=G, steps=5, coefficients=card.module.COEFFICIENTS, eps=1e-7))[0]
             for G in Gs]
    figs.append(figure("newton_schulz", name, "library", dtype, shape,
                       lambda: [c() for c in calls], device, flops=flops, baseline="native",
                       baseline_ms=native.ms, prime=PRIME, notes=lib.name))
    return figs


def _cuda_versions(name, shape, Gs, dtype, device, flops, native_ms) -> list:
    """Level 5's other versions beside its default (the ladder, side by side; no goal: the
    default's figure above carries it). Version 1 runs on the CUDA cores at ~9 TFLOP/s
    (0.2-2.4 s a call past 1024^2), so it is timed only up to CUDA_CORE_LIMIT elements."""
    from cuda_kernels import newton_schulz as k5

    figs = []
    default = k5.resolve_version()
    for v, idea in sorted(k5.VERSIONS.items()):
        if v == default:
            continue
        label = f"v{v} {name}"
        if v > 1 and k5.default_version() != k5.HOPPER_VERSION:
            figs.append(figure_skip(label, "cuda", dtype, shape, "needs an sm_90 GPU (wgmma)"))
            continue
        if v == 1 and sum(G.numel() for G in Gs) > CUDA_CORE_LIMIT:
            figs.append(figure_skip(label, "cuda", dtype, shape,
                                    "version 1 (CUDA cores) is timed at 1024x1024 only"))
            continue
        def call(G, v=v):
            return k5.newton_schulz(G, 5, *cards.get("newton_schulz").module.COEFFICIENTS, 1e-7,
                                    version=v)
        figs.append(figure("newton_schulz", label, "cuda", dtype, shape, _over_list(call, Gs),
                           device, flops=flops, baseline="native", baseline_ms=native_ms,
                           prime=PRIME, notes=f"v{v}: {idea}"))
    return figs


def _parameter_list_figures(name, groups, dtype, device) -> list:
    """A model's parameter list as Muon steps it: "native loop" (Level 1, one call per weight)
    is the baseline; every level (Level 1 too) and the library call then run one batched
    call per shape on that shape's (B, rows, cols) stack, their ratios to the loop."""
    stacks = [torch.stack(_matrices([s] * count, dtype, device)) for s, count in groups]
    weights = [G for stack in stacks for G in stack.unbind(0)]
    shape = {"groups": [[*s, count] for s, count in groups]}
    card = cards.get("newton_schulz")
    flops = sum(card.flops({"G": G, "steps": 5})["fwd"] for G in stacks)
    loop = figure("newton_schulz", name, "native loop", dtype, shape,
                  _over_list(levels.get("native").newton_schulz, weights), device, flops=flops,
                  prime=PRIME, notes=f"Level 1 once per weight: {len(weights)} calls")
    figs = [loop]
    batched = None
    for level in ("native", "compile") + KERNEL_LEVELS:
        reason = levels.status(level, device, "newton_schulz")
        if reason:
            figs.append(figure_skip(name, level, dtype, shape, reason))
            continue
        extra = None if batched is None else {"vs_native_batched": None}
        fig = figure("newton_schulz", name, level, dtype, shape,
                     _over_list(levels.get(level).newton_schulz, stacks), device, flops=flops,
                     baseline="native loop", baseline_ms=loop.ms,
                     goal=GOAL if level in KERNEL_LEVELS else None, prime=PRIME, extra=extra,
                     notes=f"{len(stacks)} batched calls, one per shape")
        if batched is None:
            batched = fig
        else:
            fig.extra["vs_native_batched"] = batched.ms / fig.ms
        figs.append(fig)
    lib = card.libraries(device, dtype)[0]
    calls = [lib.prepare(dict(G=G, steps=5, coefficients=card.module.COEFFICIENTS, eps=1e-7))[0]
             for G in stacks]
    figs.append(figure("newton_schulz", name, "library", dtype, shape,
                       lambda: [c() for c in calls], device, flops=flops, baseline="native loop",
                       baseline_ms=loop.ms, prime=PRIME, notes=lib.name + ", batched per shape"))
    return figs


def figure_skip(name, level, dtype, shape, reason):
    return Figure(component="newton_schulz", name=name, level=level,
                  dtype=str(dtype).replace("torch.", ""), shape=dict(shape), ms=float("nan"),
                  spread_ms=(float("nan"), float("nan")), notes=f"not timed: {reason}")


def run(device) -> list:
    device = torch.device(device)
    dtype = torch.bfloat16
    figs = []
    with torch.no_grad():
        for rows, cols in SQUARE:
            Gs = _matrices([(rows, cols)], dtype, device)
            figs += _levels_figures(f"{rows}x{cols}", [(rows, cols)], Gs, dtype, device)
        for name, groups in PARAMETER_LISTS.items():
            figs += _parameter_list_figures(name, groups, dtype, device)
        from triton_kernels.newton_schulz import symmetric_product

        for M in (4096, 8192):
            X = _matrices([(M, 4096)], dtype, device)[0]
            flops = 2 * M * M * 4096  # what a full GEMM computes: the symmetric kernel's "effective"
            shape = {"M": M, "K": 4096}
            base = figure("newton_schulz", f"X X^T {M}x4096", "library", dtype, shape,
                          lambda X=X: torch.matmul(X, X.T), device, flops=flops, prime=PRIME,
                          notes="torch.matmul(X, X.T): cuBLAS computes both triangles")
            out = torch.empty((M, M), dtype=dtype, device=device)
            figs += [base, figure("newton_schulz", f"X X^T {M}x4096", "triton", dtype, shape,
                                  lambda X=X, out=out: symmetric_product(X, out=out), device,
                                  flops=flops, baseline="torch.matmul(X, X.T)",
                                  baseline_ms=base.ms, goal=SYMMETRIC_GOAL, prime=PRIME,
                                  notes="one triangle of tiles, mirrored on store")]
    return figs
