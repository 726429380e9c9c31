"""Attention's new features on the GPU, timed: RoPE fused into Levels 4 and 5 against attention
alone and against rope x2 + attention (the bench's `_rope_fused` figures, goal: fused within
1.05x of alone), and Level 5's versions 3-5 at the attention bench's shape with and without
grouped K/V heads, against SDPA's FLASH backend in the same run (did the grown kernels cost
the common case anything?).

    python scripts/probe_attention_rope_gqa.py OUT.json [LEVEL ...]

LEVEL: triton, cuda or both (the default); with triton alone, Level 5 is neither built nor
timed (the versions table is Level 5's).
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

from equivalence.commands.bench.attention import _rope_fused
from equivalence.environment import describe


def versions(B=4, H=16, N=4096, D=128, dtype=torch.bfloat16) -> list[dict]:
    from cuda_kernels import attention as k5  # the versions' entry: levels.cuda picks one

    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for H_kv in (H, H // 4):
        q = torch.randn((B, H, N, D), generator=g).to("cuda", dtype)
        k, v = (torch.randn((B, H_kv, N, D), generator=g).to("cuda", dtype) for _ in range(2))
        for causal in (False, True):
            flops = 4 * B * H * N * N * D // (2 if causal else 1)
            sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                q, k, v, is_causal=causal, enable_gqa=H_kv != H)
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                base = do_bench(sdpa, warmup=25, rep=100, return_mode="median")
            for version in (3, 4, 5):
                fn = lambda: k5.attention(q, k, v, causal, D ** -0.5, version=version)  # noqa: E731
                ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                rows.append(dict(B=B, H=H, H_kv=H_kv, N=N, D=D, causal=causal, version=version,
                                 ms=ms, tflops=flops / ms / 1e9, flash_ms=base,
                                 vs_flash=base / ms))
                print(f"v{version} H_kv={H_kv} causal={causal}: {flops / ms / 1e9:.0f} TFLOP/s, "
                      f"{base / ms:.2f}x FLASH", flush=True)
    return rows


def main(out: str, chosen=("triton", "cuda")) -> None:
    figures = [f.to_dict() for f in _rope_fused("cuda", tuple(chosen))]
    for f in figures:
        print(f"{f['level']:7s} {f['name']:55s} {f['ms']:.3f} ms ratio {f['ratio']} met {f['met']} "
              f"unfused/fused {f['extra'].get('ratio_fused_over_unfused')}", flush=True)
    result = {"command": " ".join(["python scripts/probe_attention_rope_gqa.py", out, *chosen]),
              "environment": describe("cuda"), "rope_fused": figures,
              "level5_versions": versions() if "cuda" in chosen else []}
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ("triton", "cuda"))
