"""Level 4's symmetric product X X^T in two launch orders: row by row (group 1) and in bands of
SYM_GROUP tile rows (triton_kernels/newton_schulz.py banded_lower_tile), against
torch.matmul(X, X.T), at the bench's shapes and others, bf16, on the GPU.

    python scripts/probe_sym_order.py OUT.json

Timing: triton.testing.do_bench (medians, its own L2 flush), the three sides in rotated rounds
(cuBLAS, group 1, group 8, then rotated), five rounds; the result is each side's median over
its rounds and the spread. Both orders must give the same bits (asserted): they compute each
tile the same way, only in another order.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
import triton.testing

from triton_kernels import newton_schulz as K

SHAPES = [(4096, 4096), (8192, 4096), (6144, 6144), (4096, 11008), (8192, 8192), (2048, 8192)]
ROUNDS = 5


def main(out_path: str) -> None:
    rows = []
    for M, Kd in SHAPES:
        x = torch.randn(M, Kd, device="cuda", dtype=torch.bfloat16)
        plain = K.symmetric_product(x, group=1)
        banded = K.symmetric_product(x, group=K.SYM_GROUP)
        assert torch.equal(plain, banded), f"{M}x{Kd}: the two orders differ"
        sides = {"cublas": lambda: torch.matmul(x, x.T),
                 "group 1": lambda: K.symmetric_product(x, group=1),
                 f"group {K.SYM_GROUP}": lambda: K.symmetric_product(x, group=K.SYM_GROUP)}
        names = list(sides)
        times = {n: [] for n in names}
        for r in range(ROUNDS):
            for n in names[r % 3:] + names[:r % 3]:
                times[n].append(triton.testing.do_bench(sides[n], warmup=25, rep=100))
        med = {n: statistics.median(v) for n, v in times.items()}
        row = dict(M=M, K=Kd, ms=med, spread={n: [min(v), max(v)] for n, v in times.items()},
                   vs_cublas={n: med["cublas"] / med[n] for n in names[1:]})
        rows.append(row)
        print(f"X X^T {M}x{Kd}: cuBLAS {med['cublas']:.4f} ms, "
              + ", ".join(f"{n} {med[n]:.4f} ms ({med['cublas'] / med[n]:.2f}x)" for n in names[1:]))
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__)
    with open(out_path, "w") as f:
        json.dump(dict(command="python scripts/probe_sym_order.py OUT.json", environment=env,
                       rounds=ROUNDS, rows=rows), f, indent=1)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/probe_sym_order.py OUT.json")
    main(sys.argv[1])
