"""Why Level 5 attention's end-to-end time sits far above its kernel time at model shapes
(reports/h100-suite-models.json: ViT-B/16 forward 0.174 ms end to end vs 0.078 ms kernel,
while Level 4's two figures agree), when `levels bench --overhead` at the tiny size finds
only ~26 us of host time over eager: the host time per call, calls back to back, at the
suite's shapes, with and without autograd, Levels 4 and 5 and SDPA, then the CPU side of a
few Level 5 calls under torch.profiler (which C++ or Python frames take the time).

    python scripts/probe_attention_host.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

import levels
from equivalence.environment import describe
from equivalence.timing import time_fn, time_host

SHAPES = [(64, 12, 197, 64, False), (32, 12, 512, 64, False), (128, 8, 77, 64, True),
          (1, 2, 37, 16, False)]  # ViT, BERT, CLIP text (the suite's), the overhead bench's tiny


def _sides():
    l4, l5 = levels.get("triton"), levels.get("cuda")
    return {"sdpa": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
            "triton": lambda q, k, v, c: l4.attention(q, k, v, causal=c),
            "cuda": lambda q, k, v, c: l5.attention(q, k, v, causal=c)}


def main(path: str) -> None:
    rows, profiles = [], {}
    g = torch.Generator().manual_seed(0)
    for B, H, N, D, causal in SHAPES:
        q, k, v = (torch.randn((B, H, N, D), generator=g).to("cuda", torch.bfloat16)
                   for _ in range(3))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        for name, fn in _sides().items():
            row = dict(shape=[B, H, N, D], causal=causal, side=name)
            try:
                with torch.no_grad():
                    row["host_nograd_us"] = time_host(lambda: fn(q, k, v, causal), "cuda").median_ms * 1e3
                row["host_grad_us"] = time_host(lambda: fn(*leaves, causal), "cuda").median_ms * 1e3
                row["kernel_us"] = time_fn(lambda: fn(q, k, v, causal), "cuda", prime=True).median_ms * 1e3
                row["events_us"] = time_fn(lambda: fn(*leaves, causal), "cuda").median_ms * 1e3
            except Exception as exc:  # noqa: BLE001 - recorded, the probe goes on
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print({k: (round(x, 1) if isinstance(x, float) else x) for k, x in row.items()}, flush=True)
        if N == 197:
            from torch.profiler import ProfilerActivity, profile
            for name in ("triton", "cuda"):
                fn = _sides()[name]
                for _ in range(3):
                    fn(*leaves, causal)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(20):
                        fn(*leaves, causal)
                    torch.cuda.synchronize()
                profiles[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
                print(profiles[name], flush=True)
    with open(path, "w") as f:
        json.dump(dict(what=__doc__.split("\n\n")[0], environment=describe(), rows=rows,
                       profiles=profiles, command="python scripts/probe_attention_host.py OUT.json"),
                  f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
