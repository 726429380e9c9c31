"""Level 4's conv_bn (triton_kernels/conv_bn.py) on a GPU, at the ResNet-50 shapes of the model
suite (equivalence/cards/conv_bn.py MODEL_SHAPES), in one call:

  1. check Level 4 against the float64 reference through the harness (check_args: the output,
     every gradient, the running statistics) at each shape and each of its directions, full
     size, bf16 channels_last; a case that fails is recorded and not timed for Level 4;
  2. time each shape's directions (eval fwd under no_grad; train fwd+bwd with autograd, one
     upstream gradient): eager cuDNN F.conv2d + F.batch_norm, Level 4, and Level 5's
     version 4 for reference (skipped with --no-level5, or where it cannot build); triton's
     do_bench, median and p20/p80 over its repetitions (kernel time plus whatever host time
     the GPU waits for: at the small layer3/layer4 shapes a step's launches are part of it);
  3. with --profile, Level 4's train step under torch.profiler: each kernel's GPU time per
     step, to see which pass a shape's time goes to; with --host-profile, the step's host
     time under cProfile (what the GPU waits for at the small shapes).

    PYTHONPATH=. python3 scripts/device_conv_bn_level4.py OUT.json [--check-only] [--profile]
        [--host-profile] [--no-level5] [--shapes a,b]

Prints a table; writes OUT.json (GPU, versions, date, every check and figure). The shapes'
helpers (argument making, timing, the callers) are scripts/device_conv_bn5.py's. About 1-2 min
on an H100 (79 s measured with a cold Triton cache and Level 5's 37 s build; --no-level5
skips Level 5).
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.device_conv_bn5 import (  # noqa: E402
    PARAMS, _args, _callers, _shapes, finish, new_report, parse_args)
from scripts.device_conv_bn5 import run_timings as base_timings  # noqa: E402

LEVEL5 = "level5_v4"


def _check(shape, variant):
    from equivalence.check import check_args

    start = time.perf_counter()
    try:
        r = check_args("conv_bn", "triton", _args(shape, variant == "train", seed=1))
        entry = {"status": r.status, "summary": r.summary()}
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        entry = {"status": "error", "summary": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc(limit=4)}
    entry["seconds"] = round(time.perf_counter() - start, 2)
    return entry


def run_checks(shapes, report):
    failed = set()
    for s in shapes:
        for variant, _ in s.directions:
            key = f"{s.name}/{variant}"
            entry = _check(s, variant)
            report["checks"][key] = entry
            if entry["status"] != "pass":
                failed.add((s.name, variant))
            print(f"  {'ok  ' if entry['status'] == 'pass' else 'FAIL'} level4 {key}: "
                  f"{entry['summary'][:150]} ({entry['seconds']} s)", flush=True)
    return failed


def _step(fn, params, rm, rv, dy):
    def step():
        torch.autograd.grad(fn(params, rm, rv, True), list(params.values()), dy)
    return step


def _level4_step(s, warm):
    """Level 4's train step (forward + backward) at shape s, run `warm` times."""
    a = _args(s, True)
    rm, rv = a["running_mean"].clone(), a["running_var"].clone()
    params = {k: a[k].detach().requires_grad_(True) for k in PARAMS}
    fn = _callers(a)["level4"]
    with torch.no_grad():
        dy = torch.randn_like(fn(params, rm, rv, True))
    step = _step(fn, params, rm, rv, dy)
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    return step


def _profile(s, report):
    """Level 4's train step at shape s under torch.profiler: GPU microseconds per step of
    each kernel (summed over its launches in the step)."""
    from torch.profiler import ProfilerActivity, profile

    step = _level4_step(s, 3)
    steps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per_kernel = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us:
            per_kernel[e.key[:60]] = [round(us / steps, 1), e.count // steps]
    per_kernel = dict(sorted(per_kernel.items(), key=lambda kv: -kv[1][0]))
    report["profiles"][s.name] = per_kernel
    total = sum(v[0] for v in per_kernel.values())
    print(f"  {s.name}: {total:.0f} us of kernels per train step")
    for k, (us, n) in per_kernel.items():
        print(f"      {us:9.1f} us  x{n:<3d} {k}")


def _host_profile(s, report):
    """cProfile of 200 Level 4 train steps at shape s: where a step's host time goes (at the
    small shapes the GPU waits for it)."""
    import cProfile
    import io
    import pstats

    step = _level4_step(s, 5)
    start = time.perf_counter()
    for _ in range(200):
        step()
    torch.cuda.synchronize()
    us = (time.perf_counter() - start) / 200 * 1e6
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        step()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    report["host_profiles"][s.name] = {"us_per_step": us, "cprofile": text.getvalue()}
    print(f"  {s.name}: {us:.0f} us of wall time per train step (no profiler)")
    print(text.getvalue()[-6000:])


def run_timings(shapes, failed, report, with_level5):
    def pick(a):
        return {k: v for k, v in _callers(a).items()
                if k in ("cudnn", "level4") or (with_level5 and k == LEVEL5)}
    base_timings(shapes, failed, report, pick, "level4")


def main():
    out, only = parse_args(__doc__)
    report = new_report(("timings",), versions=None)
    report.update(profiles={}, host_profiles={})
    start = time.perf_counter()
    with_level5 = "--no-level5" not in sys.argv and "--check-only" not in sys.argv
    if with_level5:
        try:
            from cuda_kernels import build
            build.ops()
        except Exception as exc:  # noqa: BLE001 - Level 5 is only the reference here
            report["level5"] = f"not built: {type(exc).__name__}: {exc}"[:300]
            with_level5 = False
    shapes = _shapes(only)
    print(f"[conv_bn level4] {report['gpu']}: checks (float64 reference, full size)")
    failed = run_checks(shapes, report)
    if "--check-only" not in sys.argv:
        print("[conv_bn level4] timings (bf16 channels_last; ms median [p20, p80], ratio to cuDNN)")
        run_timings(shapes, failed, report, with_level5)
    if "--profile" in sys.argv:
        print("[conv_bn level4] Level 4 train step, GPU time per kernel")
        for s in shapes:
            if any(v == "train" for v, _ in s.directions):
                _profile(s, report)
    if "--host-profile" in sys.argv:
        print("[conv_bn level4] Level 4 train step, host time (cProfile)")
        for s in shapes:
            if any(v == "train" for v, _ in s.directions):
                _host_profile(s, report)
    finish(report, out, start, failed, "conv_bn level4")


if __name__ == "__main__":
    main()
