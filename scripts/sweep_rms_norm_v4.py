"""Level 5 rms_norm's backward, version 4, swept on the GPU: every plan it can be forced to
(the op's `force`: R rows an iteration, 1, 2 or 4; 9: one row, the next row's loads issued
before this row's math), its rule's choice, version 3 and Level 4, at widths from 256 to 8192
columns, bf16 and fp32, each as a fraction of a copy's bandwidth timed in the same run: the
measurements behind rms_norm.cu's bwd_v4_rule.

    python scripts/sweep_rms_norm_v4.py OUT.json

Kernel time (equivalence.timing, prime=True: the backward's kernels alone, not the host's
enqueue), each shape's sides timed in 3 rounds with the order rotated (the median of the
rounds' medians). Bytes as `levels bench` counts them: x and dy read, dx written; the
dweight partials are the kernel's own overhead. "x+dy" (torch.add into a third tensor) moves
the same bytes the same way with no math: the ceiling of this access pattern. Every side's dx
and dweight are compared with version 3's first (relative difference, in the JSON).
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from cuda_kernels import build
from cuda_kernels import rms_norm as k5
from equivalence.environment import describe
from equivalence.timing import time_fn
from triton_kernels import rms_norm as k4

ELEMENTS = 64 * 2**20  # x has 64 Mi elements at every width (16384 x 4096: the bench's size)
WIDTHS = (256, 768, 1024, 2048, 3072, 4096, 5120, 8192)
ROUNDS = 3


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main(path: str) -> None:
    build.load()
    ops = torch.ops.levels_cuda
    rows = []
    for dtype in (torch.bfloat16, torch.float32):  # fp16 ran as bf16 within 0.01 (first sweep)
        for N in WIDTHS:
            M = ELEMENTS // N
            x = torch.randn((M, N), device="cuda", dtype=dtype)
            w = torch.randn((N,), device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            _, rstd = ops.rms_norm_fwd(x, w, 1e-6, 3)
            nbytes = 3 * x.numel() * x.element_size()
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            _, x4, rstd4 = k4._forward(x, w, 1e-6, save=True)
            dx_buf = torch.empty_like(x)
            sides = {"copy": lambda: dst.copy_(src),
                     # the backward's own traffic (two reads, one write) with no math: what
                     # this access pattern reaches, beside the copy's one read, one write
                     "x+dy": lambda: torch.add(x, dy, out=dx_buf),
                     "L4": lambda: k4._backward(dy, x4, w, rstd4),
                     "v3": lambda: ops.rms_norm_bwd(dy, x, w, rstd, 3, 0),
                     "v4 rule": lambda: ops.rms_norm_bwd(dy, x, w, rstd, 4, 0)}
            for r in k5.FORCES[4]:
                sides[f"v4 force={r}"] = lambda r=r: ops.rms_norm_bwd(dy, x, w, rstd, 4, r)
            ref_dx, ref_dw = ops.rms_norm_bwd(dy, x, w, rstd, 3, 0)
            row = {"dtype": str(dtype).replace("torch.", ""), "M": M, "N": N, "sides": {}}
            live = {}
            for name, fn in sides.items():
                try:
                    out = fn()
                    torch.cuda.synchronize()
                except RuntimeError as e:  # a forced R these sizes cannot run: say so, go on
                    row["sides"][name] = {"error": str(e)[:200]}
                    continue
                entry = {}
                if name not in ("copy", "x+dy"):
                    entry = {"rel_dx_vs_v3": _rel(out[0], ref_dx), "rel_dw_vs_v3": _rel(out[1], ref_dw)}
                row["sides"][name] = entry
                live[name] = fn
            order = list(live)
            per = {n: [] for n in order}
            for k in range(ROUNDS):
                for name in order[k % len(order):] + order[:k % len(order)]:
                    per[name].append(time_fn(live[name], "cuda", min_time_s=0.15, prime=True).median_ms)
            copy_ms = statistics.median(per["copy"])
            for name in order:
                ms = statistics.median(per[name])
                row["sides"][name].update(ms=ms, round_ms=per[name],
                                          fraction_of_copy=copy_ms / ms)
            rows.append(row)
            print(f"{row['dtype']:>8} {M:>7}x{N:<5} " + "  ".join(
                f"{n} {row['sides'][n].get('fraction_of_copy', float('nan')):.2f}"
                for n in sides if n != "copy"), flush=True)
            del x, dy, src, dst, x4, dx_buf
    with open(path, "w") as f:
        json.dump(dict(what="Level 5 rms_norm backward v4 (every R), v3 and Level 4, as a "
                            "fraction of a copy of the same bytes (x, dy read; dx written)",
                       elements=ELEMENTS, rounds=ROUNDS, environment=describe(), rows=rows),
                  f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
