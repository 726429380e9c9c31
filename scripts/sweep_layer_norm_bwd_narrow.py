"""Level 4 layer_norm's backward at model widths (GPT-2 small's 768 to 4096 columns, 8192
rows: a `levels train --preset gpu` step), every (BLOCK_M, num_warps, programs per SM)
candidate beside the rule's pick, as kernel time and as a fraction of a device copy of the
same bytes (x + dy read, dx written: 1.5 clones). Why: in a GPT step the backward ran at
54 us a call for 13 us of bytes (scripts/probe_model_host.py's top kernels), far below the
0.83x copy measured at 16384x4096 where the rule was set.

    python scripts/sweep_layer_norm_bwd_narrow.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time

import torch

from equivalence.environment import describe
from equivalence.timing import time_fn
from triton_kernels import layer_norm as k4
from triton_kernels import rms_norm as r4

WIDTHS = [768, 1024, 1536, 2048, 4096]
ROWS = [8192, 32768]
CANDIDATES = [(bm, nw, ps) for bm in (1, 2, 4, 8, 16) for nw in (2, 4, 8, 16) for ps in (2, 4, 8)]


def _old_rule(N: int) -> tuple:
    """The backward tiling before rows of <= 2048 columns got their own (16K elements per
    iteration, 16 warps at these widths), pinned so that the same run times both."""
    BLOCK_N = k4.next_power_of_2(N)
    BLOCK_M = min(64, max(1, 16384 // BLOCK_N))
    elems = BLOCK_M * BLOCK_N
    return BLOCK_M, 4 if elems <= 2048 else (8 if elems < 8192 else 16), 2


def _ms(fn) -> float:
    return time_fn(fn, "cuda", min_time_s=0.03, prime=True).median_ms


def main(path: str) -> None:
    rows, t0 = [], time.time()
    dtype = torch.bfloat16
    for M in ROWS:
        for N in WIDTHS:
            x = torch.randn((M, N), device="cuda", dtype=dtype)
            w = torch.randn((N,), device="cuda", dtype=dtype)
            b = torch.randn((N,), device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            src = torch.empty(M * N * 2, dtype=torch.uint8, device="cuda")
            copy_ms = _ms(lambda: src.clone())
            xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))

            def bwd_ms(tiling):
                y = k4.layer_norm(xg, wg, bg, 1e-5, backward_tiling=tiling)
                return _ms(lambda: torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True))

            row = dict(M=M, N=N, copy_ms=copy_ms, rule=list(k4._backward_tiling(N)),
                       old_rule=list(_old_rule(N)))
            row["rule_ms"] = bwd_ms(None)
            row["old_rule_ms"] = bwd_ms(_old_rule(N))
            # rms_norm's backward shares the tiling rule (one row reduction instead of two)
            y = r4.rms_norm(xg, wg, 1e-6)
            row["rms_norm_rule_ms"] = _ms(lambda: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True))
            y = r4.rms_norm(xg, wg, 1e-6, backward_tiling=_old_rule(N))
            row["rms_norm_old_rule_ms"] = _ms(lambda: torch.autograd.grad(y, (xg, wg), dy, retain_graph=True))
            row["candidates"] = {}
            for bm, nw, ps in CANDIDATES:
                if bm * k4.next_power_of_2(N) > 16384 or bm * k4.next_power_of_2(N) < 32 * nw:
                    continue
                try:
                    row["candidates"][f"{bm}x{nw}x{ps}"] = bwd_ms((bm, nw, ps))
                except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                    row["candidates"][f"{bm}x{nw}x{ps}"] = f"{type(exc).__name__}"
            timed = {k: v for k, v in row["candidates"].items() if isinstance(v, float)}
            best = min(timed, key=timed.get)
            row["best"], row["best_ms"] = best, timed[best]
            rows.append(row)
            print(f"M{M} N{N}: old rule {row['old_rule']} {row['old_rule_ms'] * 1e3:.1f} us; rms_norm "
                  f"rule {row['rms_norm_rule_ms'] * 1e3:.1f} us, old {row['rms_norm_old_rule_ms'] * 1e3:.1f} us")
            print(f"M{M} N{N}: copy {copy_ms * 1e3:.1f} us; rule {row['rule']} "
                  f"{row['rule_ms'] * 1e3:.1f} us ({1.5 * copy_ms / row['rule_ms']:.2f}x copy); "
                  f"best {best} {timed[best] * 1e3:.1f} us ({1.5 * copy_ms / timed[best]:.2f}x); "
                  f"top5 {sorted(timed.items(), key=lambda kv: kv[1])[:5]}", flush=True)
            del x, dy, src, xg
    with open(path, "w") as f:
        json.dump(dict(what=__doc__.split("\n\n")[0], environment=describe(), rows=rows,
                       elapsed_s=time.time() - t0,
                       command="python scripts/sweep_layer_norm_bwd_narrow.py OUT.json"), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
