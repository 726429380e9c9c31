"""Level 4's rope-fused attention on the GPU after its tiles were sized to shared memory
(_fit_rope): checked against Level 1 once, then timed against attention alone and against
rope x2 + attention at the bench's shape (B4 H32 N2048 D128 causal bf16), both pair layouts,
forward and forward+backward (do_bench medians; the three in the same run).

    python scripts/probe_rope_fused_triton.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

import levels
from equivalence.environment import describe


def main(out: str) -> None:
    L, L1 = levels.get("triton"), levels.get("native")
    B, H, N, D = 4, 32, 2048, 128
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn((B, H, N, D), generator=g).to("cuda", torch.bfloat16) for _ in range(4))
    inv = 10000.0 ** -(torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.outer(torch.arange(N, dtype=torch.float64), inv)
    cos, sin = (f(ang).to("cuda", torch.bfloat16) for f in (torch.cos, torch.sin))
    small = [t[:1, :2, :256] for t in (q, k, v)]
    rows = []
    for interleaved in (False, True):
        got = L.attention(*small, True, rope=(cos, sin, interleaved)).float()
        want = L1.attention(*small, True, rope=(cos, sin, interleaved)).float()
        err = ((got - want).norm() / want.norm()).item()
        calls = {"alone": lambda: L.attention(q, k, v, True),
                 "fused": lambda i=interleaved: L.attention(q, k, v, True, rope=(cos, sin, i)),
                 "unfused": lambda i=interleaved: L.attention(L.rope(q, cos, sin, i),
                                                              L.rope(k, cos, sin, i), v, True)}
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def train(name, i=interleaved):
            qq, kk, vv = leaves
            o = {"alone": lambda: L.attention(qq, kk, vv, True),
                 "fused": lambda: L.attention(qq, kk, vv, True, rope=(cos, sin, i)),
                 "unfused": lambda: L.attention(L.rope(qq, cos, sin, i), L.rope(kk, cos, sin, i),
                                                vv, True)}[name]()
            o.backward(do)
        row = {"layout": "interleaved" if interleaved else "half-split", "rel_err_vs_level1": err}
        for name, fn in calls.items():
            row[f"fwd_{name}_ms"] = do_bench(fn, warmup=10, rep=50, return_mode="median")
            row[f"fwdbwd_{name}_ms"] = do_bench(lambda n=name: train(n), warmup=5, rep=30,
                                                return_mode="median")
        for what in ("fwd", "fwdbwd"):
            row[f"{what}_fused_over_alone"] = row[f"{what}_fused_ms"] / row[f"{what}_alone_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    json.dump({"command": f"python scripts/probe_rope_fused_triton.py {out}",
               "environment": describe("cuda"), "shape": dict(B=B, H=H, N=N, D=D), "rows": rows,
               "goal": "fused <= 1.05x alone"}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
