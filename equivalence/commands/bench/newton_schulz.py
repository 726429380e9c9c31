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
iteration (the card's library call) and torch.compile of the Level 1 math.

Every side of one comparison (at one shape or list: the baseline, torch.compile, Levels 4
and 5, Level 5's other versions and the library call; at one X: torch.matmul and the
symmetric kernel) is timed in rounds (goals.figures_in_rounds): every side once a round, the
order rotated. Sustained bf16 GEMMs lower an H100's clock within seconds, so timed one after
the other the baseline, timed first, ran on a cooler GPU. A side that raises is reported and
left out; a level not available here keeps its "not timed" figure."""

from __future__ import annotations

import math

import torch

import levels
from ... import cards

from .goals import Figure, figures_in_rounds

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


def _in_rounds(sides, device) -> list:
    """The specs among `sides` timed together in rounds (figures_in_rounds, kernel time; a
    spec's `against` counts specs only), their figures in the sides' order, each side that is
    a Figure already (figure_skip) in its place. A side that failed is left out."""
    specs = [s for s in sides if isinstance(s, dict)]
    timed = {(f.name, f.level): f for f in figures_in_rounds(specs, device, prime=PRIME)}
    return [s if isinstance(s, Figure) else timed[s["name"], s["level"]] for s in sides
            if isinstance(s, Figure) or (s["name"], s["level"]) in timed]


def _levels_figures(name, shapes, Gs, dtype, device) -> list:
    card = cards.get("newton_schulz")
    flops = sum(card.flops({"G": G, "steps": 5})["fwd"] for G in Gs)
    shape = {"shapes": [list(s) for s in shapes]}
    side = dict(component="newton_schulz", name=name, dtype=dtype, shape=shape, flops=flops)
    sides = [dict(side, level="native", fn=_over_list(levels.get("native").newton_schulz, Gs),
                  notes="three cuBLAS GEMMs + three pointwise passes a step")]
    for level in ("compile",) + KERNEL_LEVELS:
        reason = levels.status(level, device, "newton_schulz")
        if reason:
            sides.append(figure_skip(name, level, dtype, shape, reason))
            continue
        sides.append(dict(side, level=level, fn=_over_list(levels.get(level).newton_schulz, Gs),
                          baseline="native", against=0,
                          goal=GOAL if level in KERNEL_LEVELS else None))
        if level == "cuda":
            sides += _cuda_versions(side, Gs)
    lib = card.libraries(device, dtype)[0]
    calls = [lib.prepare(dict(G=G, steps=5, coefficients=card.module.COEFFICIENTS, eps=1e-7))[0]
             for G in Gs]
    sides.append(dict(side, level="library", fn=lambda: [c() for c in calls], baseline="native",
                      against=0, notes=lib.name))
    return _in_rounds(sides, device)


def _cuda_versions(side, Gs) -> list:
    """Level 5's other versions beside its default (the ladder, side by side; no goal: the
    default's figure carries it), as sides of the rounds (`side`: the comparison's common
    spec). Version 1 runs on the CUDA cores at ~9 TFLOP/s (0.2-2.4 s a call past 1024^2),
    so it is timed only up to CUDA_CORE_LIMIT elements."""
    from cuda_kernels import newton_schulz as k5

    sides = []
    default = k5.resolve_version()
    for v, idea in sorted(k5.VERSIONS.items()):
        if v == default:
            continue
        label = f"v{v} {side['name']}"
        if v > 1 and k5.default_version() != k5.HOPPER_VERSION:
            sides.append(figure_skip(label, "cuda", side["dtype"], side["shape"],
                                     "needs an sm_90 GPU (wgmma)"))
            continue
        if v == 1 and sum(G.numel() for G in Gs) > CUDA_CORE_LIMIT:
            sides.append(figure_skip(label, "cuda", side["dtype"], side["shape"],
                                     "version 1 (CUDA cores) is timed at 1024x1024 only"))
            continue
        def call(G, v=v):
            return k5.newton_schulz(G, 5, *cards.get("newton_schulz").module.COEFFICIENTS, 1e-7,
                                    version=v)
        sides.append(dict(side, name=label, level="cuda", fn=_over_list(call, Gs),
                          baseline="native", against=0, notes=f"v{v}: {idea}"))
    return sides


def _parameter_list_figures(name, groups, dtype, device) -> list:
    """A model's parameter list as Muon steps it: "native loop" (Level 1, one call per weight)
    is the baseline; every level (Level 1 too) and the library call then run one batched
    call per shape on that shape's (B, rows, cols) stack, their ratios to the loop."""
    stacks = [torch.stack(_matrices([s] * count, dtype, device)) for s, count in groups]
    weights = [G for stack in stacks for G in stack.unbind(0)]
    shape = {"groups": [[*s, count] for s, count in groups]}
    card = cards.get("newton_schulz")
    flops = sum(card.flops({"G": G, "steps": 5})["fwd"] for G in stacks)
    side = dict(component="newton_schulz", name=name, dtype=dtype, shape=shape, flops=flops)
    sides = [dict(side, level="native loop",
                  fn=_over_list(levels.get("native").newton_schulz, weights),
                  notes=f"Level 1 once per weight: {len(weights)} calls")]
    for level in ("native", "compile") + KERNEL_LEVELS:
        reason = levels.status(level, device, "newton_schulz")
        if reason:
            sides.append(figure_skip(name, level, dtype, shape, reason))
            continue
        sides.append(dict(side, level=level,
                          fn=_over_list(levels.get(level).newton_schulz, stacks),
                          baseline="native loop", against=0,
                          goal=GOAL if level in KERNEL_LEVELS else None,
                          notes=f"{len(stacks)} batched calls, one per shape"))
    lib = card.libraries(device, dtype)[0]
    calls = [lib.prepare(dict(G=G, steps=5, coefficients=card.module.COEFFICIENTS, eps=1e-7))[0]
             for G in stacks]
    sides.append(dict(side, level="library", fn=lambda: [c() for c in calls],
                      baseline="native loop", against=0, notes=lib.name + ", batched per shape"))
    figs = _in_rounds(sides, device)
    batched = next((f for f in figs if f.level == "native"), None)  # Level 1, batched
    for f in figs:
        if batched and f.level in ("compile",) + KERNEL_LEVELS and not math.isnan(f.ms):
            f.extra["vs_native_batched"] = batched.ms / f.ms
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
            out = torch.empty((M, M), dtype=dtype, device=device)
            # flops: what a full GEMM computes (the symmetric kernel's "effective" rate)
            side = dict(component="newton_schulz", name=f"X X^T {M}x4096", dtype=dtype,
                        shape={"M": M, "K": 4096}, flops=2 * M * M * 4096)
            figs += _in_rounds([
                dict(side, level="library", fn=lambda X=X: torch.matmul(X, X.T),
                     notes="torch.matmul(X, X.T): cuBLAS computes both triangles"),
                dict(side, level="triton", fn=lambda X=X, out=out: symmetric_product(X, out=out),
                     baseline="torch.matmul(X, X.T)", against=0, goal=SYMMETRIC_GOAL,
                     notes="one triangle of tiles, mirrored on store")], device)
    return figs
