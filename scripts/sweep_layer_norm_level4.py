"""Level 4 layer_norm where the first width sweep found cliffs (reports/h100-sweep-layer-norm-before.json:
bf16 forward 0.29x copy at 4097 columns, backward 0.02-0.07x past 16384), timed as kernel time
(the queue primed: equivalence.timing, so the backward's Python autograd node is not what is
measured) after the fixes: the rule's tiles (`_tiling` now gives rows that cannot be loaded
as 16-byte vectors more warps) and the chunked wide path above 16384 columns; beside them
every forward (BLOCK_M, num_warps) candidate at the odd widths, so the rule is read off the
same run. Fractions of a device copy of the same bytes (forward x + y, backward x + dy + dx).

    python scripts/sweep_layer_norm_level4.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time

import torch

from equivalence.environment import describe
from equivalence.timing import time_fn
from triton_kernels import layer_norm as k4

WIDTHS = [127, 1000, 1023, 3000, 4096, 4097, 8191, 12289, 16383, 16384, 16385, 24576, 32768, 65536]
CASE_BYTES = 256 * 2 ** 20
FORWARD_CANDIDATES = [(1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 8), (4, 16), (8, 8),
                      (16, 8), (32, 8)]
ODD = {127, 1000, 1023, 3000, 4097, 8191, 12289, 16383}


def _ms(fn) -> float:
    return time_fn(fn, "cuda", min_time_s=0.05, prime=True).median_ms


def main(path: str) -> None:
    rows, t0 = [], time.time()
    for dtype in (torch.bfloat16, torch.float32):
        es = torch.finfo(dtype).bits // 8
        for N in WIDTHS:
            M = max(1, CASE_BYTES // (2 * N * es))
            x = torch.randn((M, N), device="cuda", dtype=dtype)
            w = torch.randn((N,), device="cuda", dtype=dtype)
            b = torch.randn((N,), device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            src = torch.empty(M * N * es, dtype=torch.uint8, device="cuda")  # clone: read + write = x + y
            copy_ms = _ms(lambda: src.clone())
            row = dict(dtype=str(dtype), N=N, M=M, copy_ms=copy_ms,
                       rule=list(k4._tiling(N, None, k4._aligned(x, N))), wide=N > k4.WIDE)
            try:
                row["fwd_ms"] = _ms(lambda: k4._forward(x, w, b, 1e-5, save=True))
                xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
                y = k4.layer_norm(xg, wg, bg, 1e-5)
                row["bwd_ms"] = _ms(lambda: torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True))
                ref = torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5)
                row["fwd_max_err"] = (k4._forward(x, w, b, 1e-5, save=False)[0].float() - ref).abs().max().item()
                row["fwd_x_copy"] = copy_ms / row["fwd_ms"]
                row["bwd_x_copy"] = 1.5 * copy_ms / row["bwd_ms"]
            except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if N in ODD and dtype == torch.bfloat16:
                row["forward_candidates"] = {}
                for bm, nw in FORWARD_CANDIDATES:
                    if bm * k4.next_power_of_2(N) > 32768:
                        continue
                    try:
                        ms = _ms(lambda: k4._forward(x, w, b, 1e-5, save=True, tiling=(bm, nw)))
                        row["forward_candidates"][f"{bm}x{nw}"] = copy_ms / ms
                    except Exception as exc:  # noqa: BLE001
                        row["forward_candidates"][f"{bm}x{nw}"] = f"{type(exc).__name__}"
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            del x, dy, src
    with open(path, "w") as f:
        json.dump(dict(what=__doc__.split("\n\n")[0], environment=describe(), rows=rows,
                       elapsed_s=time.time() - t0,
                       command="python scripts/sweep_layer_norm_level4.py OUT.json"), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
