"""Where one small call's host time goes, by what the profiler sees: every torch operator and
CUDA runtime call (cudaLaunchKernel, cudaOccupancy..., allocations) of a tiny call, forward
and forward+backward, with its own CPU time per call. `levels bench --overhead` says how
much a level's call costs over eager's; this says on what.

    python scripts/probe_call_anatomy.py OUT.json [--component rms_norm,swiglu_mlp]
                                                  [--level cuda,triton] [--calls 200]
                                                  [--shape layer_norm/gpt2-medium-train,...]

Needs a CUDA GPU. The inputs are `levels bench --overhead`'s (each card's tiny size, its
first variant, bfloat16), and so are the two passes it times (equivalence/commands/bench/
overhead.py `_passes`). Per (component, side, pass): the wall time per call, calls back to
back, and the 15 events with the most self CPU time per call (torch.profiler, CPU activity
plus CUPTI's runtime API events).

--shape COMPONENT/NAME,...: the model-shape suite's shapes (`levels bench --suite models`
lists them) instead of each component's tiny size, and those components, for a row of the
suite whose end-to-end time is far above its kernel time. At such a size the GPU may be the
slower side, and the wall per call is then the GPU's: `host_us_per_call` is the host's own
time, 30 calls issued while the GPU sleeps (torch.cuda._sleep).

--python: also cProfile the calls (`python_top25_by_own_time`): the Python the torch profiler
does not see.

--amp bf16|fp16: float32 arguments, and every call under torch.autocast of that dtype, as a
model trains under `levels train --amp`: what autocast adds to a call, at eager (torch casts
inside its operators) and at each level (levels.contract.autocasts casts before the call).
Each call enters its own autocast block (~3 us of Python, the same at every side).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from equivalence import cards, shapes  # noqa: E402
from equivalence.calls import level_impl  # noqa: E402
from equivalence.commands.bench.overhead import SIZE, _passes  # noqa: E402


def _python_top(fn, calls: int) -> str:
    """The Python functions a call spends its host time in (cProfile, by own time): the part of
    a call the torch profiler does not see."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def _anatomy(fn, calls: int, device: torch.device, python: bool = False) -> dict:
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
    host_us = None
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        # the host's own time per call: 30 calls issued while the GPU sleeps (and so cannot be
        # what the host waits for; 30 stay well inside the launch queue's depth)
        torch.cuda._sleep(int(2e9 * 0.2))
        t0 = time.perf_counter()
        for _ in range(30):
            fn()
        host_us = (time.perf_counter() - t0) * 1e6 / 30
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
    out = {"wall_us_per_call": round(wall_us, 2),
           "host_us_per_call": None if host_us is None else round(host_us, 2), "top": rows[:15]}
    if python:
        out["python_top25_by_own_time"] = _python_top(fn, calls)
        sync()
    return out


def _under_autocast(fn, device: torch.device, dtype: torch.dtype):
    def run():
        with torch.autocast(device.type, dtype=dtype):
            return fn()
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--component", default="rms_norm,swiglu_mlp,layer_norm")
    ap.add_argument("--level", default="cuda,triton")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    ap.add_argument("--python", action="store_true", help="also cProfile the calls (the Python "
                                                          "functions the torch profiler misses)")
    ap.add_argument("--shape", default=None, help="component/name of model-shape suite shapes, "
                                                  "comma-separated (default: the tiny size of "
                                                  "each --component)")
    ap.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                    help="float32 arguments, every call under torch.autocast of this dtype")
    a = ap.parse_args()
    device, dtype = torch.device(a.device), torch.float32 if a.amp else torch.bfloat16
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.amp)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("probe_call_anatomy.py: needs a CUDA GPU (or --device cpu, a smoke run of this "
                 "script); the committed runs are under reports/")
    results = []
    runs = ([tuple(s.split("/", 1)) for s in a.shape.split(",")] if a.shape
            else [(c, None) for c in a.component.split(",")])
    for component, shape_name in runs:
        card = cards.get(component)
        variant = next(iter(card.variants))
        if shape_name:  # the suite's shape: its own dtype and variant, its tiny twin on a CPU
            shape = shapes.get(component, shape_name)
            variant = shape.directions[-1][0]
            dtype = torch.float32 if device.type == "cpu" or amp else getattr(torch, shape.dtype)
            args = shapes.make_args(shape, variant, dtype, device, 0, tiny=device.type == "cpu")
        else:
            args = card.case(SIZE, variant, dtype, device, 0).args
        sides = [("eager", card.eager(device, dtype))]
        sides += [(level, level_impl(level, component, device, dtype)) for level in a.level.split(",")]
        for name, impl in sides:
            with impl.context():
                forward, forward_backward = _passes(impl, args, component, 0)
                for pass_name, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
                    if amp is not None:
                        fn = _under_autocast(fn, device, amp)
                    r = _anatomy(fn, a.calls, device, python=a.python)
                    results.append({"component": component, "shape": shape_name or "tiny",
                                    "side": name, "pass": pass_name, "amp": a.amp, **r})
                    print(f"{component:12s} {name:7s} {pass_name:8s} {r['wall_us_per_call']:8.1f} us/call"
                          f" (host alone: {r['host_us_per_call']} us)", flush=True)
                    for row in r["top"][:8]:
                        print(f"    {row['self_cpu_us_per_call']:8.2f} us  x{row['count_per_call']:.1f}  "
                              f"{row['event'][:90]}")
    env = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "none (CPU)", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(a.out).write_text(json.dumps({"environment": env, "command": " ".join(sys.argv),
                                       "rows": results}, indent=1))


if __name__ == "__main__":
    main()
