"""Attention speed goals: Level 4's flash attention against PyTorch's own fused kernels.

Timed in the same process, bf16, B=4, H=16, N=4096, D=128, causal and not:
  forward  vs SDPA with the FLASH backend pinned (goal >= 1.1x) and with the cuDNN
           backend (stretch goal >= 0.8x); FLOPs 4*B*H*N^2*D, half of that when causal
  backward vs SDPA FLASH backward (goal >= 0.9x); FLOPs 2.5x the forward's

RoPE fused (attention(..., rope=(cos, sin[, interleaved]))): Llama 2 7B's attention, bf16,
B=4, H=32, N=2048, D=128, causal, at Levels 4 and 5 (where each takes rope=), both pair
layouts, forward and forward+backward: the fused call against attention alone at the same
level and shape (goal: at most 1.05x its time, a ratio >= 1/1.05), and the unfused pair
(the level's rope kernel on q and on k, then attention) beside it, with its ratio to the
fused call in extra: what fusing saves.

Level 5 (CUDA C++): every version of cuda_kernels/attention.cu, same shape and
dtype, forward, backward alone and forward+backward, each against SDPA's FLASH backend
timed in this run (cuDNN's ratio in `extra` where that backend runs). Goals for the best
version (the fastest one measured in this run at the bench shape, for each of forward and
backward, full and causal): forward >= 0.9x FLASH, backward >= 0.7x FLASH backward. Version 1 is not run
at the bench shape: its score scratch alone is B*H*N*N*4 = 4.3 GB and one call takes
minutes (one thread a query row, every score written and read back uncoalesced); it is
timed, with v2-v4 and the same baselines, at a small shape (B1 H16 N1024 D128). A call
that takes over SLOW_CALL_S is reported from that single call, not timed repeatedly.
"""

from __future__ import annotations

import sys

import torch

from .goals import Figure, figure, one_call_ms
from ...timing import time_first_call, time_fn

SHAPE = dict(B=4, H=16, N=4096, D=128)
DTYPE = torch.bfloat16
GOAL_FLASH_FWD, GOAL_CUDNN_FWD, GOAL_FLASH_BWD = 1.1, 0.8, 0.9


def unavailable_reason(device) -> str | None:
    if torch.device(device).type != "cuda":
        return "the attention goals compare CUDA kernels (SDPA flash/cuDNN vs Level 4): needs a GPU"
    import levels
    return levels.status("triton", device, "attention")


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def call(q, k, v, causal):
        with sdpa_kernel(backend):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def _figure(name, causal, ms_t, base_name, base_t, flops, goal, notes=""):
    ratio = base_t.median_ms / ms_t.median_ms if base_t else None
    return Figure(component="attention", name=name, level="triton", dtype="bfloat16",
                  shape=dict(SHAPE, causal=causal), ms=ms_t.median_ms,
                  spread_ms=(ms_t.p20_ms, ms_t.p80_ms), tflops=flops / ms_t.median_ms / 1e9,
                  baseline=base_name, baseline_ms=base_t.median_ms if base_t else None,
                  ratio=ratio, goal=goal, met=(ratio >= goal) if ratio is not None else None,
                  notes=notes,
                  extra={"baseline_tflops": flops / base_t.median_ms / 1e9 if base_t else None,
                         "flops": flops, "runs": ms_t.runs})


def run(device) -> list[Figure]:
    import levels
    from torch.nn.attention import SDPBackend

    device = torch.device(device)
    ours = levels.get("triton").attention
    flash, cudnn = _sdpa(SDPBackend.FLASH_ATTENTION), _sdpa(SDPBackend.CUDNN_ATTENTION)
    B, H, N, D = SHAPE["B"], SHAPE["H"], SHAPE["N"], SHAPE["D"]
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn((B, H, N, D), generator=g).to(device=device, dtype=DTYPE)
                   for _ in range(4))
    figures = []
    for causal in (False, True):
        fwd_flops = 4 * B * H * N * N * D // (2 if causal else 1)
        tag = "causal" if causal else "full"
        with torch.no_grad():
            first = time_first_call(lambda: ours(q, k, v, causal), device)
            t_ours = time_fn(lambda: ours(q, k, v, causal), device)
            t_flash = time_fn(lambda: flash(q, k, v, causal), device)
            try:
                t_cudnn, why = time_fn(lambda: cudnn(q, k, v, causal), device), ""
            except RuntimeError as exc:  # backend not built / not supported here
                t_cudnn, why = None, f"cuDNN backend unavailable: {exc}"
        figures.append(_figure(f"forward bf16 {tag} N{N} D{D}", causal, t_ours, "SDPA FLASH backend",
                               t_flash, fwd_flops, GOAL_FLASH_FWD,
                               f"first call (JIT compile) {first:.0f} ms"))
        figures.append(_figure(f"forward bf16 {tag} N{N} D{D} (stretch)", causal, t_ours,
                               "SDPA cuDNN backend", t_cudnn, fwd_flops, GOAL_CUDNN_FWD, why))

        # Backward alone: one forward with the graph kept, then time the gradient calls.
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out_ours = ours(*leaves, causal)
        out_flash = flash(*leaves, causal)
        grad = lambda out: torch.autograd.grad(out, leaves, do, retain_graph=True)  # noqa: E731
        first = time_first_call(lambda: grad(out_ours), device)
        t_ours = time_fn(lambda: grad(out_ours), device)
        t_flash = time_fn(lambda: grad(out_flash), device)
        figures.append(_figure(f"backward bf16 {tag} N{N} D{D}", causal, t_ours,
                               "SDPA FLASH backend backward", t_flash, fwd_flops * 5 // 2,
                               GOAL_FLASH_BWD, f"first call (JIT compile) {first:.0f} ms"))
        del out_ours, out_flash, leaves
    figures += _level5(device)
    figures += _rope_fused(device)
    return figures


# ---------------------------------------------------------------------------------------
# RoPE fused into attention, at the levels that fuse it
# ---------------------------------------------------------------------------------------

ROPE_SHAPE = dict(B=4, H=32, N=2048, D=128)  # Llama 2 7B: 32 heads x 128, 2048-token sequences
GOAL_ROPE = 1 / 1.05  # fused <= 1.05x the time of attention alone: alone / fused >= 0.952


def _rope_fused(device, levels_=("triton", "cuda")) -> list[Figure]:
    import levels

    B, H, N, D = (ROPE_SHAPE[k] for k in ("B", "H", "N", "D"))
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn((B, H, N, D), generator=g).to(device=device, dtype=DTYPE)
                   for _ in range(4))
    # Llama's tables (base 10000), built once outside the timed calls, as a model caches them
    inv_freq = 10000.0 ** -(torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.outer(torch.arange(N, dtype=torch.float64), inv_freq)
    cos, sin = (f(angles).to(device=device, dtype=DTYPE) for f in (torch.cos, torch.sin))
    fwd_flops = 4 * B * H * N * N * D // 2  # causal
    figures = []
    for level in levels_:
        reason = levels.status(level, device, "attention")
        if reason:
            print(f"attention bench: rope fused at {level} skipped: {reason}", file=sys.stderr)
            continue
        L = levels.get(level)
        for interleaved in (False, True):
            layout = "interleaved" if interleaved else "half-split"
            calls = {
                "alone": lambda q, k, v: L.attention(q, k, v, True),
                "fused": lambda q, k, v, i=interleaved: L.attention(q, k, v, True,
                                                                   rope=(cos, sin, i)),
                "unfused": lambda q, k, v, i=interleaved: L.attention(
                    L.rope(q, cos, sin, i), L.rope(k, cos, sin, i), v, True)}
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            for what, flops in (("forward", fwd_flops), ("forward+backward", fwd_flops * 7 // 2)):
                def timed(call, what=what):
                    if what == "forward":
                        return lambda: call(q, k, v)
                    return lambda: torch.autograd.grad(call(*leaves), leaves, do)
                shape = dict(ROPE_SHAPE, causal=True, rope=layout)
                name = f"{what} bf16 causal N{N} D{D} rope {layout}"
                try:
                    with torch.set_grad_enabled(what != "forward"):
                        alone = figure("attention", f"{name}: attention alone", level, DTYPE,
                                       shape, timed(calls["alone"]), device, flops=flops)
                        fused = figure("attention", f"{name}: fused", level, DTYPE, shape,
                                       timed(calls["fused"]), device, flops=flops,
                                       baseline=f"attention alone at {level}",
                                       baseline_ms=alone.ms, goal=GOAL_ROPE,
                                       notes="q and k turned in registers as they are loaded")
                        unfused = figure("attention", f"{name}: rope x2 + attention", level,
                                         DTYPE, shape, timed(calls["unfused"]), device,
                                         flops=flops, baseline=f"attention alone at {level}",
                                         baseline_ms=alone.ms,
                                         notes="the level's rope on q and on k, then attention")
                except Exception as exc:  # noqa: BLE001 - a level without rope= must not hide the other
                    print(f"attention bench: {name} at {level} failed: {type(exc).__name__}: "
                          f"{str(exc)[:300]}", file=sys.stderr)
                    continue
                unfused.extra["ratio_fused_over_unfused"] = unfused.ms / fused.ms
                fused.extra["unfused_ms"] = unfused.ms
                figures += [alone, fused, unfused]
    return figures


# ---------------------------------------------------------------------------------------
# Level 5: the CUDA C++ ladder
# ---------------------------------------------------------------------------------------

LEVEL5_SHAPES = {"bench": SHAPE, "small": dict(B=1, H=16, N=1024, D=128)}
GOAL_L5_FWD, GOAL_L5_BWD = 0.9, 0.7  # of SDPA FLASH, for the default (best) version
SLOW_CALL_S = 1.0


class _Single:
    """A Timing of one call (for versions too slow to time repeatedly)."""

    def __init__(self, ms: float):
        self.median_ms = self.p20_ms = self.p80_ms = ms
        self.runs = 1


def _l5_figure(name, shape, version, idea, t, flops, base_t, cudnn_t, goal, notes=""):
    ratio = base_t.median_ms / t.median_ms
    return Figure(component="attention", name=name, level="cuda", dtype="bfloat16", shape=shape,
                  ms=t.median_ms, spread_ms=(t.p20_ms, t.p80_ms), tflops=flops / t.median_ms / 1e9,
                  baseline="SDPA FLASH backend", baseline_ms=base_t.median_ms, ratio=ratio, goal=goal,
                  met=(ratio >= goal) if goal else None, notes=notes,
                  extra={"version": version, "idea": idea, "flops": flops, "runs": t.runs,
                         "baseline_tflops": flops / base_t.median_ms / 1e9,
                         "cudnn_ms": cudnn_t.median_ms if cudnn_t else None,
                         "ratio_to_cudnn": cudnn_t.median_ms / t.median_ms if cudnn_t else None})


def _level5(device) -> list[Figure]:
    import levels

    reason = levels.status("cuda", device, "attention")
    if reason:
        print(f"attention bench: Level 5 skipped: {reason}", file=sys.stderr)
        return []
    import cuda_kernels.attention as k5
    from torch.nn.attention import SDPBackend

    flash, cudnn = _sdpa(SDPBackend.FLASH_ATTENTION), _sdpa(SDPBackend.CUDNN_ATTENTION)
    figures = []
    for label, shp in LEVEL5_SHAPES.items():
        B, H, N, D = shp["B"], shp["H"], shp["N"], shp["D"]
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn((B, H, N, D), generator=g).to(device=device, dtype=DTYPE)
                       for _ in range(4))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        versions = [v_ for v_ in sorted(k5.VERSIONS) if label != "bench" or v_ != 1]
        for causal in (False, True):
            tag = "causal" if causal else "full"
            shape = dict(shp, causal=causal, shape=label)
            fwd_flops = 4 * B * H * N * N * D // (2 if causal else 1)

            def fwd(fn):
                return lambda: fn(q, k, v, causal)

            def fwd_bwd(fn):
                return lambda: torch.autograd.grad(fn(*leaves, causal), leaves, do)

            def bwd_of(fn):
                out = fn(*leaves, causal)
                return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)

            def maybe(make):  # cuDNN's backend is not built or not supported everywhere
                try:
                    return time_fn(make(), device)
                except RuntimeError as exc:
                    print(f"attention bench: cuDNN backend unavailable: {str(exc)[:200]}", file=sys.stderr)
                    return None

            with torch.no_grad():
                base = {"forward": time_fn(fwd(flash), device)}
                cud = {"forward": maybe(lambda: fwd(cudnn))}
            base["backward"] = time_fn(bwd_of(flash), device)
            cud["backward"] = maybe(lambda: bwd_of(cudnn))
            base["forward+backward"] = time_fn(fwd_bwd(flash), device)
            cud["forward+backward"] = maybe(lambda: fwd_bwd(cudnn))
            flops = {"forward": fwd_flops, "backward": fwd_flops * 5 // 2,
                     "forward+backward": fwd_flops * 7 // 2}
            for version in versions:
                def ours(q, k, v, causal, version=version):  # the kernels' entry, this version
                    return k5.attention(q, k, v, causal, version=version)
                for what in ("forward", "backward", "forward+backward"):
                    name = f"{what} bf16 {tag} N{N} D{D} cuda v{version}"
                    try:
                        with torch.set_grad_enabled(what != "forward"):
                            fn = {"forward": fwd, "backward": bwd_of, "forward+backward": fwd_bwd}[what](ours)
                            first = one_call_ms(fn, device)  # the build, once, and the first call
                            single = one_call_ms(fn, device)
                            if single > SLOW_CALL_S * 1e3:
                                t, notes = _Single(single), f"one call > {SLOW_CALL_S:g} s: not timed repeatedly"
                            else:
                                t, notes = time_fn(fn, device), f"first call {first:.0f} ms"
                        figures.append(_l5_figure(name, shape, version, k5.VERSIONS[version], t,
                                                  flops[what], base[what], cud[what], None, notes))
                    except Exception as exc:  # noqa: BLE001 - one failing version must not hide the others
                        print(f"attention bench: {name} failed: {type(exc).__name__}: {str(exc)[:300]}",
                              file=sys.stderr)
            if label == "bench":
                _mark_best(figures, shape, {"forward": GOAL_L5_FWD, "backward": GOAL_L5_BWD})
    return figures


def _mark_best(figures, shape, goals) -> None:
    """The goal belongs to the ladder's best rung: for each timed kind (forward, backward),
    the fastest version of this shape and causality carries the goal and whether it is met."""
    for what, goal in goals.items():
        mine = [f for f in figures if f.shape == shape and f.name.startswith(what + " ")]
        if mine:
            best = min(mine, key=lambda f: f.ms)
            best.goal, best.met = goal, best.ratio >= goal
            best.notes = (best.notes + "; " if best.notes else "") + "fastest version: carries the goal"
