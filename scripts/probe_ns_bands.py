"""Level 5 Newton-Schulz (its default version) against native, five bf16 steps, at the
bench's shapes and a larger one: the figure the symmetric launch order (cuda_kernels/
tile_order.h) changes. Run it in two builds to compare the orders: the default, and
LEVELS_CUDA_NVCC_FLAGS=-DLEVELS_SYM_BAND=1 (row by row everywhere).

    python scripts/probe_ns_bands.py OUT.json

Timing: triton.testing.do_bench medians, native and Level 5 in rotated rounds (five), in
one process; the ratio is native / Level 5 (> 1: Level 5 faster).
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import triton.testing

import levels
from cuda_kernels import build

SHAPES = [(1024, 1024), (4096, 4096), (4096, 11008), (8192, 8192)]
ROUNDS = 5


def main(out_path: str) -> None:
    native, cuda = levels.get("native"), levels.get("cuda")
    rows = []
    for shape in SHAPES:
        g = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        sides = {"native": lambda: native.newton_schulz(g), "cuda": lambda: cuda.newton_schulz(g)}
        times = {n: [] for n in sides}
        for r in range(ROUNDS):
            for n in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                times[n].append(triton.testing.do_bench(sides[n], warmup=10, rep=60))
        med = {n: statistics.median(v) for n, v in times.items()}
        rows.append(dict(shape=list(shape), ms=med, spread={n: [min(v), max(v)] for n, v in times.items()},
                         ratio=med["native"] / med["cuda"]))
        print(f"newton_schulz {shape[0]}x{shape[1]}: native {med['native']:.3f} ms, Level 5 "
              f"{med['cuda']:.3f} ms: {med['native'] / med['cuda']:.2f}x", flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(command="python scripts/probe_ns_bands.py OUT.json",
                       nvcc_flags=os.environ.get("LEVELS_CUDA_NVCC_FLAGS", ""),
                       gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       build=build.last_build(), rounds=ROUNDS, rows=rows), f, indent=1)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/probe_ns_bands.py OUT.json")
    main(sys.argv[1])
