"""Steps issued back to back against steps synchronized one by one, and what blocks the host.
A probe of one model's training step at each run (a level, or torch's twin): the wall time per
step synchronized after each step, the same steps issued back to back (one synchronize at the
end: with the host ahead, a step costs the larger of its host and GPU times), and, for the
back-to-back steps, every CUDA runtime/driver call the host made that can block it
(synchronizations, allocations, frees, event waits, copies), counted with its host time per
step, and the caching allocator's device allocations, frees and retries.

(Written when scripts/probe_model_host.py's `back_to_back_ms`, which stops the clock before
the final synchronize, put Level 4's CNN `--amp` step at 8.2 ms against 5.5 ms synchronized.
On the next host this probe found nothing blocking and Level 4 faster back to back:
reports/host-path-interleaved/back-to-back-cnn*.json.)

    python scripts/probe_back_to_back.py OUT.json --model cnn [--amp bf16] [--runs triton,torch]

A step that blocks the host (an implicit synchronization: a cudaFree when the caching
allocator gives memory back, a device-to-host copy, an event wait) cannot run ahead of the
GPU, so back to back it costs host time + GPU time instead of the larger of the two.
Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_model_host import amp_dtype, probe_arguments, setup, write_report  # noqa: E402 (same directory)

BLOCKING = ("Synchronize", "Malloc", "Free", "Memcpy", "EventQuery", "StreamWaitEvent",
            "HostAlloc", "MemGetInfo", "emptyCache")


def _back_to_back(step, batches, steps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


def probe(model: str, name: str, amp, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    net, opt, step, batches, items, unit, p = setup(model, name, amp)
    for x, y in batches[:3]:
        step(x, y)
    synced = []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(*batches[i % len(batches)])
        torch.cuda.synchronize()
        synced.append((time.perf_counter() - t0) * 1e3)
    b2b = [_back_to_back(step, batches, steps) for _ in range(3)]
    stats = torch.cuda.memory_stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _back_to_back(step, batches, 5)
    calls: dict = {}
    for e in prof.key_averages():
        if any(b in e.key for b in BLOCKING):
            calls[e.key] = {"count_per_step": e.count / 5,
                            "host_us_per_step": round(e.self_cpu_time_total / 5, 1)}
    return {"run": name, "synced_ms_median": statistics.median(synced), "synced_ms": synced,
            "back_to_back_ms": b2b, "blocking_calls_back_to_back": calls,
            "allocator": {k: stats.get(k) for k in ("num_alloc_retries", "num_device_alloc",
                                                    "num_device_free", "num_sync_all_streams")}}


def main() -> None:
    ap = probe_arguments("triton,torch")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    amp = amp_dtype(args)
    rows = [probe(args.model, name, amp, args.steps) for name in args.runs.split(",")]
    for r in rows:
        print(f"{r['run']:>8}: synced {r['synced_ms_median']:.2f} ms, back to back "
              f"{', '.join(f'{v:.2f}' for v in r['back_to_back_ms'])} ms; blocking calls "
              f"{r['blocking_calls_back_to_back']}; allocator {r['allocator']}")
    write_report(args.out, args.model, args.amp, rows)


if __name__ == "__main__":
    main()
