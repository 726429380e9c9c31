"""Does a training step's time depend on what ran just before it? `levels train` interleaves its
runs (every run's step i before any run's step i + 1), so a Level 4 step often follows native's
step: ~100 ms of Python that keeps the CPU busy and leaves the GPU nearly idle. Here one run's
step (synchronized, timed alone) follows, in turn:

    self      its own previous step (how a real training loop runs)
    sleep     100 ms of time.sleep (CPU and GPU idle)
    spin      100 ms of a pure-Python loop (CPU busy, its caches filled with other work; GPU idle)
    gpu       100 ms of matmuls on the GPU (GPU busy and hot, the host waits)
    native    one step of the native (Level 1) model, as in the table

    python scripts/probe_step_after.py OUT.json [--model lstm] [--runs triton,torch] [--amp bf16]
                                       [--repeats 15]

Per run and predecessor: the median step time and its spread, and the GPU's SM clock (MHz,
torch.cuda.clock_rate through NVML, where it answers) read right before the timed step. A
step that is slower after `sleep`/`native` than after `self` and `gpu` waits for a GPU whose
clock fell while it idled; one that is slower after `spin` too pays for a cold host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from equivalence.commands.bench.goals import sm_clock_mhz  # noqa: E402
from probe_model_host import amp_dtype, setup  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="lstm")
    ap.add_argument("--runs", default="triton,torch")
    ap.add_argument("--amp", choices=["bf16"], default=None)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    amp = amp_dtype(args)

    runs = {name: setup(args.model, name, amp) for name in ["native", *args.runs.split(",")]}
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def gpu_busy():
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    def spin():
        end, n = time.perf_counter() + 0.1, 0
        while time.perf_counter() < end:
            n += sum(i * i for i in range(200))

    def native_step():
        _, _, step, batches, *_ = runs["native"]
        step(*batches[0])
        torch.cuda.synchronize()

    before = {"self": None, "sleep": lambda: time.sleep(0.1), "spin": spin, "gpu": gpu_busy,
              "native": native_step}
    result = {"model": args.model, "amp": args.amp, "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}
    for name in args.runs.split(","):
        _, _, step, batches, *_ = runs[name]
        for i in range(3):  # warm: compile, plans, allocator
            step(*batches[i % len(batches)])
        torch.cuda.synchronize()
        for label, fn in before.items():
            ms, mhz = [], []
            for i in range(args.repeats):
                if fn is None:
                    step(*batches[i % len(batches)])
                    torch.cuda.synchronize()
                else:
                    fn()
                mhz.append(sm_clock_mhz("cuda"))
                t0 = time.perf_counter()
                step(*batches[i % len(batches)])
                torch.cuda.synchronize()
                ms.append((time.perf_counter() - t0) * 1e3)
            ms.sort()
            row = {"run": name, "after": label, "median_ms": round(statistics.median(ms), 3),
                   "p20_p80": [round(ms[len(ms) // 5], 3), round(ms[(4 * len(ms)) // 5], 3)],
                   "sm_mhz_before": [m for m in mhz if m is not None][:args.repeats]}
            result["rows"].append(row)
            print(f"{name:7s} after {label:6s} {row['median_ms']:7.2f} ms  p20-p80 {row['p20_p80']}"
                  f"  SM MHz {sorted(set(row['sm_mhz_before']))[:6]}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
