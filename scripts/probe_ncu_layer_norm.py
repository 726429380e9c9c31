"""Level 5 layer_norm at the widths where it falls short of issue #28's 0.85x copy (odd and
wide rows), each case's forward and backward launched a few times, for ncu:

    ncu --clock-control none --kernel-name regex:"fwd_v|bwd_v|sum_partials" \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \\
        python scripts/probe_ncu_layer_norm.py [--cases bf16:16384:4,bf16:4097:4] [--calls 2]

A case is dtype:N:version[:path] (path: cuda_kernels.layer_norm.PATHS, 0 = the rule's);
rows M are chosen as scripts/sweep_layer_norm.py chooses them (about 256 MB moved by a
forward). Outputs are not checked here: the sweep and the tests do that. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.sweep_layer_norm import DTYPES, EPS, rows_for  # noqa: E402

DEFAULT_CASES = ("bf16:4097:4,bf16:8192:5,bf16:16384:4,bf16:32768:4,bf16:65536:4,"
                 "fp32:16384:4,fp32:65536:4")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--calls", type=int, default=2, help="forward + backward pairs per case")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_ncu_layer_norm: needs a CUDA GPU", file=sys.stderr)
        return 2
    from cuda_kernels import build
    build.load()
    ops = torch.ops.levels_cuda
    for case in a.cases.split(","):
        name, n, version, *path = case.split(":")
        N, version = int(n), int(version)
        extra = (int(path[0]),) if path and int(path[0]) else ()
        dtype = DTYPES[name]
        M = rows_for(N, dtype.itemsize)
        x = torch.randn(M, N, device="cuda", dtype=dtype)
        w = torch.randn(N, device="cuda", dtype=dtype)
        b = torch.randn(N, device="cuda", dtype=dtype)
        dy = torch.randn(M, N, device="cuda", dtype=dtype)
        print(f"case {case}: {M}x{N}", flush=True)
        for _ in range(a.calls):
            y, mean, rstd = ops.layer_norm_fwd(x, w, b, EPS, version, *extra)
            ops.layer_norm_bwd(dy, x, w, mean, rstd, version, *extra)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
