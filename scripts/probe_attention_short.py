"""Levels 4 and 5 attention at short key sequences, timed: Level 4's one-pass backward
(`_attn_bwd_short`, where a head's keys fit one block) against the three-launch split it
replaces, Level 5's default version, and SDPA's FLASH and cuDNN backends, forward and
forward+backward, kernel time (the queue primed: equivalence.timing), bf16, in one run.

    python scripts/probe_attention_short.py OUT.json

Issue #29's goal for N <= 512: forward >= 0.9x and forward+backward >= 0.8x FLASH. The last
three shapes (197, 512 and 1024 keys) take the split backward: ViT's and BERT's are the rest
of the goal, GPT-2's shows the long path unchanged.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import levels
import triton_kernels.attention as kernels
from equivalence.environment import describe
from equivalence.timing import time_fn

SHAPES = [  # B, H, H_kv, N, D, causal
    (64, 12, 12, 77, 64, False),   # CLIP's text encoder (the table)
    (32, 12, 12, 128, 64, True),   # a short causal context
    (16, 16, 4, 100, 64, True),    # grouped-query heads
    (32, 12, 12, 197, 64, False),  # ViT-B/16 (the split backward: more keys than one block)
    (16, 12, 12, 512, 64, False),  # BERT-base
    (8, 12, 12, 1024, 64, True),   # GPT-2 small's training shape: the split backward
]


def _bench(fn) -> float:
    return time_fn(fn, "cuda", prime=True).median_ms


def main(path: str) -> None:
    l4, l5 = levels.get("triton"), levels.get("cuda")
    rows = []
    g = torch.Generator().manual_seed(0)
    for B, H, H_kv, N, D, causal in SHAPES:
        mk = lambda h: torch.randn((B, h, N, D), generator=g).to("cuda", torch.bfloat16)  # noqa: E731
        q, k, v = mk(H), mk(H_kv), mk(H_kv)
        do = torch.randn_like(q)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        scale = D ** -0.5
        flops_fwd = 4 * B * H * N * N * D // (2 if causal else 1)

        def fwd_bwd(call):
            def run():
                for t in leaves:
                    t.grad = None
                call(*leaves).backward(do)
            return run

        calls = {
            "level4": lambda q, k, v: l4.attention(q, k, v, causal),
            "level4 split backward": lambda q, k, v: kernels.attention(
                q, k, v, causal, scale, backward_config=kernels._bwd_config(D, q.dtype)),
            "level5": lambda q, k, v: l5.attention(q, k, v, causal),
        }
        for name, backend in (("FLASH", SDPBackend.FLASH_ATTENTION),
                              ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(q, k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                          enable_gqa=H_kv != H)
            calls[name] = sdpa
        row = dict(shape=dict(B=B, H=H, H_kv=H_kv, N=N, D=D, causal=causal),
                   one_pass=kernels._short_config(N, N, kernels.head_tile(D), torch.bfloat16)
                   is not None, ms={})
        for name, call in calls.items():
            try:
                with torch.no_grad():
                    fwd = _bench(lambda: call(q, k, v))
                both = _bench(fwd_bwd(call))
            except Exception as e:  # a backend that does not take this shape: say so
                row["ms"][name] = dict(error=str(e).splitlines()[0][:160])
                continue
            row["ms"][name] = dict(fwd=fwd, fwd_bwd=both)
        flash = row["ms"].get("FLASH", {})
        for name, t in row["ms"].items():
            if "fwd" in t and "fwd" in flash:
                t["fwd_vs_flash"] = flash["fwd"] / t["fwd"]
                t["fwd_bwd_vs_flash"] = flash["fwd_bwd"] / t["fwd_bwd"]
                t["fwd_tflops"] = flops_fwd / t["fwd"] / 1e9
        rows.append(row)
        print(f"B{B} H{H}/{H_kv} N{N} D{D} {'causal' if causal else 'full'} "
              f"(one-pass: {row['one_pass']}):", flush=True)
        for name, t in row["ms"].items():
            if "fwd" in t:
                print(f"  {name:22s} fwd {t['fwd'] * 1e3:8.1f} us ({t.get('fwd_vs_flash', 0):.2f}x FLASH)"
                      f"  fwd+bwd {t['fwd_bwd'] * 1e3:8.1f} us ({t.get('fwd_bwd_vs_flash', 0):.2f}x)")
            else:
                print(f"  {name:22s} {t['error']}")
    with open(path, "w") as f:
        json.dump(dict(what="Levels 4 and 5 attention at short key sequences: Level 4's one-pass "
                       "backward vs split, Level 5's default, SDPA (kernel time, bf16)", command="python scripts/probe_attention_short.py OUT.json",
                       environment=describe("cuda"), rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
