"""Where a training step's GPU waits: the idle gaps between its kernels, and what the host was
doing when the kernel after each gap was launched.

    python scripts/probe_gpu_gaps.py OUT.json [--model gpt] [--runs triton,torch] [--amp bf16]

A step is GPU-bound when its kernels run back to back. Each gap (a kernel starting after the
one before it ended) is time the GPU waited; it ends when the host launches the next kernel,
so the host operation that launched it (the innermost torch operator or custom op around the
launch, on whichever thread: the backward runs on autograd's device thread) is what the GPU
waited for. Per run: wall time of 3 profiled steps, GPU busy time, idle time, and the idle
time grouped by that launching operator (top 15), from torch.profiler's trace (Chrome trace
format: kernels, runtime/driver launch calls and CPU ops, linked by correlation id).
"""

from __future__ import annotations

import bisect
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_model_host import (amp_dtype, probe_arguments, setup,  # noqa: E402 (same directory)
                              write_report)



def _trace(step, batches) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for x, y in batches:
            step(x, y)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return {"wall_ms": wall_ms, "events": events}


def _gaps(events: list, steps: int, min_gap_us: float = 2.0) -> dict:
    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in
                      ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X" and
                e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    by_thread: dict = {}
    for e in sorted(ops, key=lambda e: e["ts"]):
        by_thread.setdefault(e["tid"], []).append(e)
    starts = {tid: [e["ts"] for e in es] for tid, es in by_thread.items()}

    def launcher(launch) -> str:
        """The innermost CPU op on the launch's thread that contains the launch: of the ops
        that contain it (properly nested), the one that started last."""
        es, t = by_thread.get(launch["tid"], []), launch["ts"]
        i = bisect.bisect_right(starts.get(launch["tid"], []), t) - 1
        for j in range(i, max(-1, i - 400), -1):
            if t + launch.get("dur", 0) <= es[j]["ts"] + es[j]["dur"]:
                return es[j]["name"]
        return f"(no op: {launch['name']})"

    busy = sum(k["dur"] for k in kernels)
    idle, by_op, count = 0.0, {}, 0
    for prev, k in zip(kernels, kernels[1:]):
        gap = k["ts"] - (prev["ts"] + prev["dur"])
        if gap < min_gap_us:
            continue
        idle += gap
        count += 1
        launch = launches.get(k.get("args", {}).get("correlation"))
        name = launcher(launch) if launch else "(launch not found)"
        by_op[name] = by_op.get(name, 0.0) + gap
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
    return {"gpu_busy_ms_per_step": busy / 1e3 / steps, "gpu_idle_ms_per_step": idle / 1e3 / steps,
            "gaps_per_step": count / steps,
            "idle_by_launching_op_ms_per_step": [{"op": n[:100], "ms": round(v / 1e3 / steps, 3)}
                                                 for n, v in top]}


def probe(model: str, name: str, amp, steps: int = 3) -> dict:
    _, _, step, batches, _, _, _ = setup(model, name, amp, n_batches=steps)
    for x, y in batches * 2:  # first calls: compiles, records
        step(x, y)
    torch.cuda.synchronize()
    t = _trace(step, batches)
    return {"run": name, "wall_ms_per_step": t["wall_ms"] / steps, **_gaps(t["events"], steps)}


def main() -> None:
    a = probe_arguments("triton,torch").parse_args()
    amp = amp_dtype(a)
    rows = []
    for name in a.runs.split(","):
        r = probe(a.model, name, amp)
        rows.append(r)
        print(f"{name:8s} wall {r['wall_ms_per_step']:.1f} ms/step (profiled)  GPU busy "
              f"{r['gpu_busy_ms_per_step']:.1f}  idle {r['gpu_idle_ms_per_step']:.1f} ms in "
              f"{r['gaps_per_step']:.0f} gaps", flush=True)
        for g in r["idle_by_launching_op_ms_per_step"]:
            print(f"    {g['ms']:7.3f} ms  {g['op']}")
    write_report(a.out, a.model, a.amp, rows)


if __name__ == "__main__":
    main()
