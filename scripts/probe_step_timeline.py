"""Does the host lead the GPU through a training step, or wait for it? The host's clock and
the GPU's, side by side, at the end of each phase of a step, without a profiler.

    python scripts/probe_step_timeline.py OUT.json [--model gpt] [--runs triton,cuda,torch]
                                          [--amp bf16] [--steps 8]

The profiler's trace (scripts/probe_gpu_gaps.py) adds host time to every launch, so it
cannot say whether an eager step is host-bound. Here each timed step starts on an idle GPU
(synchronized), and at the end of the forward, the backward, the clipping and the update the
host reads its clock and records a CUDA event. The host time of a phase end says when the
host had *issued* that work; the event's time says when the GPU had *done* it. Where the GPU
finishes a phase long after the host issued it, the host leads (GPU-bound); where the two
times are equal, the GPU waited for the host. A host time that jumps to the GPU's time means
the host waited inside that phase: a synchronizing call. `torch.cuda.set_sync_debug_mode`
then names every synchronizing call a step makes (file and line of the Python caller).

Also per run: the forward's end per layer (block) of the model, the same two clocks, so a
slow layer shows where it is.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_model_host import (amp_dtype, probe_arguments, setup,  # noqa: E402 (same directory)
                              write_report)


def _blocks(net) -> list:
    """The repeated layers of the model (its longest ModuleList), for per-layer marks."""
    best: list = []
    for m in net.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > len(best):
            best = list(m)
    return best


def _timed_step(step, x, y, marks: list) -> dict:
    """One step on an idle GPU: host and GPU time (ms from the start) at each phase's end
    (and at each layer's, through the hooks that call marks[-1])."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    points = []

    def mark(name):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        points.append((name, (time.perf_counter() - t0) * 1e3, e))

    marks.append(mark)
    step(x, y, mark=mark)
    marks.pop()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    return {"wall_ms": wall, "points": [(n, h, start.elapsed_time(e)) for n, h, e in points]}


def probe(model: str, name: str, amp, steps: int) -> dict:
    net, _, step, batches, items, unit, p = setup(model, name, amp)
    for x, y in batches[:3]:  # first calls: compiles, records
        step(x, y)
    torch.cuda.synchronize()
    marks: list = []
    hooks = [b.register_forward_hook(lambda m, i, o, k=k: marks[-1](f"block {k}") if marks else None)
             for k, b in enumerate(_blocks(net))]
    timed = [_timed_step(step, *batches[i % len(batches)], marks) for i in range(steps)]
    for h in hooks:
        h.remove()
    # back to back: the host's issue rate when nothing synchronizes between steps
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    issued = (time.perf_counter() - t0) * 1e3 / steps
    torch.cuda.synchronize()
    b2b = (time.perf_counter() - t0) * 1e3 / steps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(*batches[0])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    syncs: dict = {}
    for w in caught:
        key = f"{Path(w.filename).name}:{w.lineno}: {str(w.message)[:120]}"
        syncs[key] = syncs.get(key, 0) + 1
    names = [n for n, _, _ in timed[0]["points"]]
    median = {n: {"host_ms": statistics.median(t["points"][i][1] for t in timed),
                  "gpu_ms": statistics.median(t["points"][i][2] for t in timed)}
              for i, n in enumerate(names)}
    return {"run": name, "batch": p["batch"], "seq_len": p.get("seq_len"),
            "items_per_step": items, "unit": unit,
            "wall_ms_median": statistics.median(t["wall_ms"] for t in timed),
            "wall_ms": [round(t["wall_ms"], 3) for t in timed],
            "issue_ms_per_step_back_to_back": issued, "wall_ms_per_step_back_to_back": b2b,
            "marks_median": median, "sync_calls_one_step": syncs}


def main() -> None:
    ap = probe_arguments("triton,cuda,torch")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    amp = amp_dtype(a)
    rows = []
    for name in a.runs.split(","):
        r = probe(a.model, name, amp, a.steps)
        rows.append(r)
        print(f"{name:8s} wall {r['wall_ms_median']:.2f} ms/step (synchronized), back to back: "
              f"issued {r['issue_ms_per_step_back_to_back']:.2f}, done "
              f"{r['wall_ms_per_step_back_to_back']:.2f} ms/step", flush=True)
        blocks = [n for n in r["marks_median"] if n.startswith("block")]
        for n, v in r["marks_median"].items():  # the first and last layer, then every phase
            if n not in blocks[1:-1]:
                print(f"    {n:10s} host {v['host_ms']:7.2f}  gpu {v['gpu_ms']:7.2f} ms")
        for k, c in r["sync_calls_one_step"].items():
            print(f"    sync x{c}: {k}")
    write_report(a.out, a.model, a.amp, rows)


if __name__ == "__main__":
    main()
