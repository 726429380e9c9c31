"""Which tile should each GEMM of a model's MLP run? Level 4's GEMM at every candidate tile,
cuBLAS (torch.matmul, same operands, same layout) beside it, for the six GEMMs of an MLP's
forward and backward at a model's shapes (GPT-2 small at the `gpu` preset by default).

    python scripts/sweep_gemm_tiles.py OUT.json [--tokens 8192] [--d 768] [--hidden 3072]

Why: tile_for picked the big 128x256 tile whenever its tiles outnumber the SMs. At
GPT-2 small's shapes most GEMMs have a few more tiles than SMs (fc2: 192 big tiles on 132
SMs), so the last wave runs a GPU that is mostly idle: wave quantization. The sweep times
each candidate so that the rule can weigh tile efficiency against waves. Kernel time only
(triton.testing.do_bench, median), bf16.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_kernels import gemm as G  # noqa: E402

CANDIDATES = {
    "128x256 s4 (BIG)": G._as_dict(G.BIG_TILE),
    "128x256 s3": G._as_dict(G.BIG_TILE_3_STAGES),
    "128x128 s4 (MID)": G._as_dict(G.MID_TILE),
    "128x128 s3": dict(G._as_dict(G.MID_TILE), num_stages=3),
    "128x64 s4 (NARROW)": G._as_dict(G.NARROW_TILE),
    "128x128 s4 split-K 2": dict(G._as_dict(G.MID_TILE), SPLIT_K=2),
    "128x64 s4 split-K 2": dict(G._as_dict(G.NARROW_TILE), SPLIT_K=2),
}


def shapes(M: int, d: int, hidden: int, dev, dtype):
    """(name, a, b, kwargs for gemm / for the epilogue) of the MLP's six GEMMs, operands as
    triton_kernels/mlp.py passes them (weights as nn.Linear stores them, transposed views)."""
    x = torch.randn(M, d, device=dev, dtype=dtype)
    w1 = torch.randn(hidden, d, device=dev, dtype=dtype) * 0.05
    w2 = torch.randn(d, hidden, device=dev, dtype=dtype) * 0.05
    b1 = torch.randn(hidden, device=dev, dtype=dtype)
    act = torch.randn(M, hidden, device=dev, dtype=dtype)
    pre = torch.randn(M, hidden, device=dev, dtype=dtype)
    dy = torch.randn(M, d, device=dev, dtype=dtype)
    dh = torch.randn(M, hidden, device=dev, dtype=dtype)
    return [
        ("fc1 fwd  X W1^T +b1, GELU (saves H)", x, w1.t(), dict(bias=b1, activation="gelu",
                                                                  preact_out=torch.empty_like(pre))),
        ("fc2 fwd  G W2^T", act, w2.t(), {}),
        ("dW2 = dY^T G", dy.t(), act, {}),
        ("dH = (dY W2) GELU'(H)", dy, w2, {"gelu_grad": pre}),
        ("dX = dH W1", dh, w1, {}),
        ("dW1 = dH^T X", dh.t(), x, {}),
    ]


def run_one(a, b, kw, config):
    if "gelu_grad" in kw:
        return G.gemm_gelu_backward(a, b, kw["gelu_grad"], check=False, config=config)
    return G.gemm(a, b, check=False, config=config, **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--hidden", type=int, default=3072)
    a = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    sms = G.sm_count(dev)
    rows = []
    for name, A, B, kw in shapes(a.tokens, a.d, a.hidden, dev, dtype):
        M, K = A.shape
        N = B.shape[1]
        flop = 2 * M * N * K
        row = {"gemm": name, "M": M, "N": N, "K": K, "sms": sms, "tiles": {}}
        rule = G.tile_for(M, N, sms)
        row["rule_pick"] = next(n for n, c in CANDIDATES.items() if c == G._as_dict(rule))
        ms = triton.testing.do_bench(lambda: torch.matmul(A, B), return_mode="median")
        row["cublas_ms"] = ms
        row["cublas_tflops"] = flop / ms / 1e9
        for cname, cfg in CANDIDATES.items():
            tiles = triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
            ms = triton.testing.do_bench(lambda: run_one(A, B, kw, cfg), return_mode="median")
            row["tiles"][cname] = {"ms": ms, "tflops": flop / ms / 1e9, "tiles": tiles,
                                   "waves": tiles * cfg.get("SPLIT_K", 1) / sms}
        ms = triton.testing.do_bench(lambda: run_one(A, B, kw, None), return_mode="median")
        row["rule_ms"] = ms
        rows.append(row)
        best = min(row["tiles"].items(), key=lambda kv: kv[1]["ms"])
        print(f"{name:38s} M{M} N{N} K{K}: cuBLAS {row['cublas_tflops']:5.0f} TFLOP/s; rule "
              f"({row['rule_pick']}) {flop / row['rule_ms'] / 1e9:5.0f}; best {best[0]} "
              f"{best[1]['tflops']:5.0f}", flush=True)
        for cname, t in row["tiles"].items():
            print(f"    {cname:24s} {t['ms'] * 1e3:8.1f} us {t['tflops']:5.0f} TFLOP/s "
                  f"{t['tiles']:5d} tiles {t['waves']:5.2f} waves", flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(a.out).write_text(json.dumps({"environment": env, "command": " ".join(sys.argv),
                                       "dtype": "bfloat16", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
