"""Level 4's norm backwards with the second stage (sum_partials_kernel) at three tiles, timed in
rotated rounds in one process: "old" (256 columns a program, 32 partial rows a step), "width"
(triton_kernels.layer_norm.partials_tile's columns, 32 rows a step) and "new" (partials_tile:
its columns and up to 8K partials a step). rms_norm's and layer_norm's whole backward (both
launches) at 16384 x {1024, 4096, 8192} bf16, and the second stage alone.

    PYTHONPATH=. python3 scripts/probe_partials_tile.py OUT.json

Kernel time: triton.testing.do_bench (L2 flushed), the median of each round; each round times
every side once, the order rotated. And GPU time alone: the kernels' durations under
torch.profiler, summed (scripts/probe_kernel_split.py's _split). Needs a CUDA GPU.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    from triton.testing import do_bench

    from scripts.probe_kernel_split import _split
    from triton_kernels import layer_norm as LN
    from triton_kernels import rms_norm as RN

    new_rule = LN.partials_tile

    def old_rule(N, P, device, halves):
        return min(LN.next_power_of_2(N), 256), 32

    def width_rule(N, P, device, halves):
        return new_rule(N, P, device, halves)[0], 32

    rules = {"old": old_rule, "width": width_rule, "new": new_rule}

    out = Path(sys.argv[1])
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for N in (1024, 4096, 8192):
        M = 16384
        g = torch.Generator(device=dev).manual_seed(N)
        x = torch.randn(M, N, device=dev, generator=g).to(dt)
        w = torch.randn(N, device=dev, generator=g).to(dt)
        b = torch.randn(N, device=dev, generator=g).to(dt)
        dy = torch.randn(M, N, device=dev, generator=g).to(dt)
        _, x2, rstd = RN._forward(x, w, 1e-6, save=True)
        xr = x.detach().requires_grad_()
        wr, br = w.detach().requires_grad_(), b.detach().requires_grad_()
        y_ln = LN.layer_norm(xr, wr, br, 1e-5)
        cases = {
            "rms_norm backward": lambda: RN._backward(dy, x2, w, rstd),
            "layer_norm backward": lambda: torch.autograd.grad(y_ln, (xr, wr, br), dy, retain_graph=True),
        }
        for name, fn in cases.items():
            times = {side: [] for side in rules}
            sides = list(rules)
            for r in range(6):
                for side in sides[r % 3:] + sides[:r % 3]:
                    LN.partials_tile = rules[side]
                    times[side].append(do_bench(fn, warmup=10, rep=50, return_mode="median"))
            LN.partials_tile = new_rule
            bytes_moved = 3 * M * N * 2
            halves = 2 if "layer" in name else 1
            row = {"what": name, "M": M, "N": N,
                   "tiles": {side: rule(N, 264, dev, halves) for side, rule in rules.items()}}
            for side in rules:
                row[side + "_ms"] = statistics.median(times[side])
                row[side + "_tbps"] = bytes_moved / row[side + "_ms"] / 1e9
                row["rounds_" + side + "_ms"] = times[side]
            # the same as GPU time alone (torch.profiler's kernel durations, summed): the
            # autograd-driven layer_norm backward of a narrow row can be host-bound, and then
            # do_bench's events time the host
            for side, rule in rules.items():
                LN.partials_tile = rule
                row[side + "_kernels_us"] = _split(fn)["sum_us"]
            LN.partials_tile = new_rule
            rows.append(row)
            print(f"{name:20s} {M}x{N} kernels only: " + "  ".join(
                f"{side} {row[side + '_kernels_us']:7.1f} us" for side in rules), flush=True)
            print(f"{name:20s} {M}x{N}: " + "  ".join(
                f"{side} {row[side + '_ms'] * 1e3:7.1f} us ({row[side + '_tbps']:.2f} TB/s)" for side in rules),
                flush=True)
        # the second stage alone, rms_norm's partials (P = 2 programs per SM)
        P = 2 * torch.cuda.get_device_properties(0).multi_processor_count
        parts = torch.randn(P, N, device=dev, generator=g)
        dweight = torch.empty(N, device=dev, dtype=dt)
        for label, rule in rules.items():
            width, block_p = rule(N, P, dev, 1)

            def stage(width=width, block_p=block_p):
                LN.sum_partials_kernel[(LN.cdiv(N, width), 1)](parts, dweight, P, N, BLOCK_P=block_p,
                                                               BLOCK_N=width)
            ms = do_bench(stage, warmup=10, rep=50, return_mode="median")
            rows.append({"what": "sum_partials alone", "P": P, "N": N, "width": width, "block_p": block_p,
                         "rule": label, "ms": ms})
            print(f"{'sum_partials alone':20s} P{P} N{N} tile {width:3d}x{block_p:3d} ({label}): "
                  f"{ms * 1e3:6.1f} us", flush=True)
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               "rows": rows}, indent=1))
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
