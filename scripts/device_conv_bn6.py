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

import datetime
import json
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


def _time(fn, params, rm, rv, training, dy):
    if training:
        def step():
            torch.autograd.grad(fn(params, rm, rv, True), list(params.values()), dy)
        return base._bench(step)
    with torch.no_grad():
        fn(params, rm, rv, False)  # builds / compiles outside the timing
        return base._bench(lambda: fn(params, rm, rv, False))


_cells, _ratios = base.cells, base.ratios  # (device_conv_bn5.py's)


def run_timings(shapes, failed, report):
    for s in shapes:
        for variant, direction in s.directions:
            training = variant == "train"
            a = base._args(s, training)
            rm, rv = a["running_mean"].clone(), a["running_var"].clone()
            params = {k: a[k].detach().requires_grad_(training) for k in base.PARAMS}
            row = {"shape": s.name, "describe": s.describe(), "variant": variant,
                   "direction": direction, "figures": {}}
            dy = None
            for name, fn in base._callers(a, (OLD, NEW)).items():
                if name == f"level5_v{NEW}" and (s.name, variant) in failed:
                    row["figures"][name] = {"skipped": "failed its check"}
                    continue
                try:
                    if training and dy is None:
                        with torch.no_grad():
                            dy = torch.randn_like(fn(params, rm, rv, True))
                    row["figures"][name] = _time(fn, params, rm, rv, training, dy)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    row["figures"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            _ratios(row["figures"])
            report["timings"].append(row)
            print(f"  {s.name:34s} {variant:5s} {direction:7s} | {_cells(row['figures'])}", flush=True)


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


def parse_args(doc):
    """(OUT path, the --shapes names) from the command line; the usage (doc) otherwise."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    only = set()
    if "--shapes" in sys.argv:
        only = set(sys.argv[sys.argv.index("--shapes") + 1].split(","))
        args = [a for a in args if a != sys.argv[sys.argv.index("--shapes") + 1]]
    if len(args) != 1:
        raise SystemExit(doc)
    return Path(args[0]), only


def new_report(sections):
    """The report's header (GPU, software, date, the pair of versions and their ideas) and an
    empty list per name in sections, after checks."""
    import triton
    from cuda_kernels import conv_bn as cb
    report = {"gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
              "sms": torch.cuda.get_device_properties(0).multi_processor_count,
              "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": {"old": OLD, "new": NEW, "ideas": {str(k): v for k, v in cb.VERSIONS.items()},
                           "default": cb.DEFAULT_VERSION},
              "dtype": "bfloat16, channels_last", "timing": "triton do_bench (warmup 10, rep 60 ms): "
              "median, p20, p80", "checks": {}}
    report.update({name: [] for name in sections})
    return report


def finish(report, out, start, failed, tag):
    report["seconds"] = round(time.perf_counter() - start, 1)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"[{tag}] {len(failed)} failed check(s); {report['seconds']} s; wrote {out}")


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
