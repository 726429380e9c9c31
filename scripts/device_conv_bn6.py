"""conv_bn.cu's version 5 (the forward on mma.sync with tiles chosen from the problem size and
split-K, conv_bn_plan.h) on an H100, in one call, at the ResNet-50 shapes of the model suite
(equivalence/cards/conv_bn.py MODEL_SHAPES):

  1. check version 5 against the float64 reference through the harness (check_args: outputs,
     every gradient, the running statistics) at each shape in eval and in train mode, full
     size, bf16 channels_last; a failure is recorded (with version 4 checked at the same case)
     and that case's version 5 is not timed;
  2. time, in the same process, each shape's directions (eval fwd under no_grad; train
     fwd+bwd with autograd, one upstream gradient): eager cuDNN F.conv2d + F.batch_norm,
     Level 5 version 4 (the default before this version), version 5, and Level 4
     (levels.triton); triton's do_bench, median and p20/p80 over its repetitions;
  3. (unless --no-sweep) version 5's eval forward at every 16-byte-path shape with each plan
     forced ($LEVELS_CONV_BN_V5_PLAN), next to the rule's: whether the rule picks the fastest.

    PYTHONPATH=. python3 scripts/device_conv_bn6.py OUT.json [--check-only] [--no-sweep]
                                                     [--shapes a,b]

Prints a table; writes OUT.json (GPU name, torch/triton/CUDA versions, date, every check and
figure). The helpers (shapes, arguments, one check, do_bench) are scripts/device_conv_bn5.py's.
Aims at < 4 min on an H100 with a cold build (version 4's run took 77 s).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import device_conv_bn5 as base  # noqa: E402  (the sys.path entry above)

NEW, OLD = 5, 4
PLAN_ENV = "LEVELS_CONV_BN_V5_PLAN"
SWEEP_PLANS = ("0", "1", "2", "2,2", "2,3", "2,4", "2,6")  # 0 128x128, 1 128x64, 2 64x64 (unsplit)


def run_checks(shapes, report):
    """Version NEW (5; device_conv_bn7.py sets 6) against float64 at every shape, eval and
    train (also where the card times only inference: the same kernels, one more case);
    returns the failed (shape, variant)."""
    failed = set()
    for s in shapes:
        for variant in ("eval", "train"):
            base.check_case(s, variant, NEW, OLD, report, failed)
    return failed


def run_timings(shapes, failed, report):
    """device_conv_bn5's timings for this module's pair (OLD, NEW: read at the call, so
    device_conv_bn7.py's pair when it sets them)."""
    base.run_timings(shapes, failed, report, lambda a: base._callers(a, (OLD, NEW)),
                     f"level5_v{NEW}")


def _v5_runs_own_kernel(s):
    """Whether version 5's own forward runs at this shape: the 16-byte path (C_in % 8 == 0,
    channels_last), and not a 1x1 stride-1 convolution with C_out >= 128 (gemm.cu's)."""
    z = s.sizes
    pointwise = z["k"] == 1 and z["stride"] == 1 and z["padding"] == 0
    return z["C_in"] % 8 == 0 and z.get("channels_last") and not (pointwise and z["C_out"] >= 128)


def run_sweep(shapes, failed, report):
    """Version 5's eval forward with each plan forced, next to the rule's (""), per shape."""
    from cuda_kernels import conv_bn as cb
    for s in shapes:
        if not _v5_runs_own_kernel(s) or (s.name, "eval") in failed:
            continue
        a = base._args(s, False)
        p = {k: a[k] for k in base.PARAMS}
        st, pad = (a["stride"],) * 2, (a["padding"],) * 2
        row = {"shape": s.name, "figures": {}}
        for plan in ("",) + SWEEP_PLANS:
            os.environ[PLAN_ENV] = plan
            try:
                def call():
                    return cb.conv_bn(p["x"], p["conv_weight"], p["conv_bias"], p["bn_weight"],
                                      p["bn_bias"], a["running_mean"], a["running_var"], st, pad,
                                      a["eps"], a["momentum"], False, version=NEW)
                with torch.no_grad():
                    call()
                    row["figures"][f"plan[{plan or 'rule'}]"] = base._bench(call)
            except Exception as exc:  # noqa: BLE001
                row["figures"][f"plan[{plan or 'rule'}]"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            finally:
                os.environ.pop(PLAN_ENV, None)
        report["sweep"].append(row)
        best = min((f["ms"], k) for k, f in row["figures"].items() if "ms" in f)
        print(f"  {s.name:34s} " + " | ".join(f"{k} {f['ms']:.3f}" for k, f in row["figures"].items()
                                              if "ms" in f) + f"  (best {best[1]})", flush=True)


parse_args, finish = base.parse_args, base.finish


def new_report(sections):
    return base.new_report(sections, (OLD, NEW))


def main():
    out, only = parse_args(__doc__)
    from cuda_kernels import build

    os.environ.pop(PLAN_ENV, None)  # the rule's plans unless the sweep pins one
    report = new_report(("timings", "sweep"))
    start = time.perf_counter()
    build.ops()
    report["build"] = build.last_build()
    shapes = base._shapes(only)
    print(f"[conv_bn6] {report['gpu']}: checks of version {NEW} (float64 reference, full size)")
    failed = run_checks(shapes, report)
    if "--check-only" not in sys.argv:
        print("[conv_bn6] timings (bf16 channels_last; ms median [p20, p80], ratio to cuDNN)")
        run_timings(shapes, failed, report)
        if "--no-sweep" not in sys.argv:
            print(f"[conv_bn6] version {NEW} eval forward, each plan forced (${PLAN_ENV}; ms median)")
            run_sweep(shapes, failed, report)
    finish(report, out, start, failed, "conv_bn6")


if __name__ == "__main__":
    main()
