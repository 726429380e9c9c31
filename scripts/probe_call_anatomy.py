"""Where one small call's host time goes, by what the profiler sees: every torch operator and
CUDA runtime call (cudaLaunchKernel, cudaOccupancy..., allocations) of a tiny call, forward
and forward+backward, with its own CPU time per call. `levels bench --overhead` says how
much a level's call costs over eager's; this says on what.

    python scripts/probe_call_anatomy.py OUT.json [--component rms_norm,swiglu_mlp]
                                                  [--level cuda,triton] [--calls 200]

Needs a CUDA GPU. The inputs are `levels bench --overhead`'s (each card's tiny size, its
first variant, bfloat16), and so are the two passes it times (equivalence/commands/bench/
overhead.py `_passes`). Per (component, side, pass): the wall time per call, calls back to
back, and the 15 events with the most self CPU time per call (torch.profiler, CPU activity
plus CUPTI's runtime API events).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from equivalence import cards  # noqa: E402
from equivalence.calls import level_impl  # noqa: E402
from equivalence.commands.bench.overhead import SIZE, _passes  # noqa: E402


def _anatomy(fn, calls: int, device: torch.device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(20):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    wall_us = (time.perf_counter() - t0) * 1e6 / calls
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        sync()
    rows = []
    for e in prof.key_averages():
        self_us = e.self_cpu_time_total / calls
        if self_us > 0.05:
            rows.append({"event": e.key, "count_per_call": e.count / calls,
                         "self_cpu_us_per_call": round(self_us, 2),
                         "cpu_us_per_call": round(e.cpu_time_total / calls, 2)})
    rows.sort(key=lambda r: -r["self_cpu_us_per_call"])
    return {"wall_us_per_call": round(wall_us, 2), "top": rows[:15]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--component", default="rms_norm,swiglu_mlp,layer_norm")
    ap.add_argument("--level", default="cuda,triton")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    a = ap.parse_args()
    device, dtype = torch.device(a.device), torch.bfloat16
    results = []
    for component in a.component.split(","):
        card = cards.get(component)
        args = card.case(SIZE, next(iter(card.variants)), dtype, device, 0).args
        sides = [("eager", card.eager(device, dtype))]
        sides += [(level, level_impl(level, component, device, dtype)) for level in a.level.split(",")]
        for name, impl in sides:
            with impl.context():
                forward, forward_backward = _passes(impl, args, component, 0)
                for pass_name, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
                    r = _anatomy(fn, a.calls, device)
                    results.append({"component": component, "side": name, "pass": pass_name, **r})
                    print(f"{component:12s} {name:7s} {pass_name:8s} {r['wall_us_per_call']:8.1f} us/call",
                          flush=True)
                    for row in r["top"][:8]:
                        print(f"    {row['self_cpu_us_per_call']:8.2f} us  x{row['count_per_call']:.1f}  "
                              f"{row['event'][:90]}")
    env = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "none (CPU)", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(a.out).write_text(json.dumps({"environment": env, "command": " ".join(sys.argv),
                                       "rows": results}, indent=1))


if __name__ == "__main__":
    main()
