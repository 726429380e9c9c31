"""conv_bn.cu's version 6 (version 5 plus a backward on mma.sync: a dgrad whose stride phases
run as forward convolutions on version 5's kernels, with tiles and K slices from conv_bn_plan.h's
cb_dgrad_plan and a 128x16 tile for C_in <= 16, and a wgrad with ldmatrix.trans tiles and pixel
splits from cb_wgrad_plan) on an H100, in one call, at the ResNet-50 shapes of the model suite
(equivalence/cards/conv_bn.py MODEL_SHAPES):

  1. check version 6 against the float64 reference through the harness at each shape in eval
     and in train mode (scripts/device_conv_bn6.py's run_checks: a failure is recorded with
     version 5 checked at the same case, and that case's version 6 is not timed);
  2. time each shape's directions (eval fwd; train fwd+bwd with autograd): cuDNN + BatchNorm,
     Level 5 version 5 (the default), version 6, and Level 4 (device_conv_bn6's run_timings);
  3. the backward alone, per shape: torch.ops.levels_cuda.conv_bn_train_bwd for versions 5 and
     6 with need_dx True and False (the same y, mean, invstd, dout), so that the dgrad's share
     (the difference) is visible, and the wgrad's change too: without dx, versions 5 and 6
     differ only in the wgrad (the BN backward kernels are the same).

    PYTHONPATH=. python3 scripts/device_conv_bn7.py OUT.json [--check-only] [--shapes a,b]

Prints a table; writes OUT.json (GPU name, versions, date, every check and figure). The
helpers (shapes, arguments, checks, do_bench, the timing table) are device_conv_bn5.py's and
device_conv_bn6.py's. Aims at < 3 min on an H100 with a cold build.
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

import device_conv_bn5 as base  # noqa: E402  (the sys.path entries above)
import device_conv_bn6 as mid  # noqa: E402

NEW, OLD = 6, 5
DGRAD_PLAN_ENV = "LEVELS_CONV_BN_V6_DGRAD_PLAN"
WGRAD_PLAN_ENV = "LEVELS_CONV_BN_V6_WGRAD_PLAN"


def _bwd_inputs(s):
    """The train backward op's inputs at shape s, from the train forward op of version 5
    (y, mean, invstd do not depend on the version beyond rounding)."""
    from cuda_kernels import build
    ops = build.ops()
    a = base._args(s, True)
    z = a["stride"], a["padding"]
    x = a["x"].permute(0, 2, 3, 1)  # (N, H, W, C_in), as conv_bn.py passes it
    w = a["conv_weight"].permute(0, 2, 3, 1).contiguous()
    st, pad = [z[0]] * 2, [z[1]] * 2
    with torch.no_grad():
        out, y, mean, invstd, _, _ = ops.conv_bn_train_fwd(
            x, w, a["conv_bias"], a["bn_weight"], a["bn_bias"], a["running_mean"].clone(),
            a["running_var"].clone(), st, pad, a["eps"], a["momentum"], OLD)
    dout = torch.randn_like(out).contiguous()
    return ops, (dout, x, w, y, mean, invstd, a["bn_weight"], st, pad)


def run_backward_breakdown(shapes, failed, report):
    """conv_bn_train_bwd alone, versions OLD and NEW, with and without dx."""
    for s in shapes:
        if not any(v == "train" for v, _ in s.directions):
            continue
        ops, args = _bwd_inputs(s)
        row = {"shape": s.name, "describe": s.describe(), "figures": {}}
        for version in (OLD, NEW):
            for need_dx in (True, False):
                name = f"v{version}_{'with' if need_dx else 'no'}_dx"
                if version == NEW and (s.name, "train") in failed:
                    row["figures"][name] = {"skipped": "failed its check"}
                    continue
                try:
                    def call(version=version, need_dx=need_dx):
                        return ops.conv_bn_train_bwd(*args, version, need_dx)
                    with torch.no_grad():
                        call()
                        row["figures"][name] = base._bench(call)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    row["figures"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        f = row["figures"]
        for version in (OLD, NEW):
            w, n = f.get(f"v{version}_with_dx", {}), f.get(f"v{version}_no_dx", {})
            if "ms" in w and "ms" in n:
                row[f"v{version}_dgrad_ms"] = w["ms"] - n["ms"]  # the dgrad's share
        report["backward"].append(row)
        cells = " | ".join(f"{k} {v['ms']:.3f}" if "ms" in v else f"{k} {v.get('skipped') or v.get('error')}"
                           for k, v in f.items())
        share = " ".join(f"dgrad v{v} {row[f'v{v}_dgrad_ms']:.3f}" for v in (OLD, NEW)
                         if f"v{v}_dgrad_ms" in row)
        print(f"  {s.name:34s} | {cells} | {share}", flush=True)


def main():
    out, only = mid.parse_args(__doc__)
    from cuda_kernels import build

    mid.NEW, mid.OLD = NEW, OLD  # device_conv_bn6's checks, timings and report, for this pair
    for env in (mid.PLAN_ENV, DGRAD_PLAN_ENV, WGRAD_PLAN_ENV):
        os.environ.pop(env, None)  # the rules' plans
    report = mid.new_report(("timings", "backward"))
    start = time.perf_counter()
    build.ops()
    report["build"] = build.last_build()
    report["build_seconds"] = round(time.perf_counter() - start, 1)
    shapes = base._shapes(only)
    print(f"[conv_bn7] {report['gpu']}: checks of version {NEW} (float64 reference, full size)")
    failed = mid.run_checks(shapes, report)
    if "--check-only" not in sys.argv:
        print("[conv_bn7] timings (bf16 channels_last; ms median [p20, p80], ratio to cuDNN)")
        mid.run_timings(shapes, failed, report)
        print("[conv_bn7] train backward op alone (ms median; dgrad = with dx - without)")
        run_backward_breakdown(shapes, failed, report)
    mid.finish(report, out, start, failed, "conv_bn7")


if __name__ == "__main__":
    main()
