"""Attention speed goals: Level 4's flash attention against PyTorch's own fused kernels.

Timed in the same process, bf16, B=4, H=16, N=4096, D=128, causal and not:
  forward  vs SDPA with the FLASH backend pinned (goal >= 1.1x) and with the cuDNN
           backend (stretch goal >= 0.8x); FLOPs 4*B*H*N^2*D, half of that when causal
  backward vs SDPA FLASH backward (goal >= 0.9x); FLOPs 2.5x the forward's
"""

from __future__ import annotations

import torch

from . import Figure
from ..timing import time_first_call, time_fn

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
    return figures
