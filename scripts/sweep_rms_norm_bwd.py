"""Level 4 rms_norm's backward, swept on the GPU: every (BLOCK_M, num_warps, programs per SM)
candidate at the bench's shape (16384 x 4096, bf16 and fp32), its kernel time and bandwidth
against a plain copy timed in the same run, so that `_backward_tiling`'s rule (shared with
layer_norm) is read off measurements.

    python scripts/sweep_rms_norm_bwd.py OUT.json

Bytes counted as the bench counts them: x and dy read, dx written (the dweight partials are
the kernel's own overhead, not counted).
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
from triton.testing import do_bench

from equivalence.environment import describe
from triton_kernels import rms_norm as k4

M, N = 16384, 4096


def main(path: str) -> None:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn((M, N), device="cuda", dtype=dtype)
        w = torch.randn((N,), device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        _, x2, rstd = k4._forward(x, w, 1e-6, save=True)
        nbytes = 3 * x.numel() * x.element_size()
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
        ref_dx, ref_dw = k4._backward(dy, x2, w, rstd)
        default = k4._backward_tiling(N)  # (BLOCK_M, BLOCK_N, num_warps, programs per SM)
        for block_m, warps, per_sm in itertools.product((1, 2, 4, 8), (4, 8, 16), (1, 2, 4)):
            tiling = (block_m, warps, per_sm)
            try:
                dx, dw = k4._backward(dy, x2, w, rstd, tiling)
                ok = bool(torch.allclose(dx, ref_dx, rtol=2e-2, atol=1e-2)
                          and torch.allclose(dw, ref_dw, rtol=2e-2, atol=1e-1))
                ms = do_bench(lambda: k4._backward(dy, x2, w, rstd, tiling), warmup=10, rep=100,
                              return_mode="median")
            except Exception as e:  # a tiling that does not compile or fit: say so, go on
                rows.append(dict(dtype=str(dtype), tiling=list(tiling), error=str(e)[:200]))
                continue
            rows.append(dict(dtype=str(dtype), tiling=list(tiling), ms=ms, copy_ms=copy_ms,
                             fraction_of_copy=copy_ms / ms, same_as_default=ok,
                             default=[default[0], default[2], default[3]]))
            print(f"{dtype} BLOCK_M={block_m} warps={warps} per_sm={per_sm}: {ms:.4f} ms "
                  f"= {copy_ms / ms:.2f}x copy{'' if ok else '  (DIFFERS from the default tiling)'}",
                  flush=True)
    with open(path, "w") as f:
        json.dump(dict(what="Level 4 rms_norm backward tilings, 16384 x 4096", shape=[M, N],
                       environment=describe(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
