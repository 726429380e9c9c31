"""conv_bn.cu's version 4 (dgrad and wgrad on the tensor cores, 1x1 convolutions through
gemm.cu's GEMM) on an H100, in one call, at the ResNet-50 shapes of the model suite
(equivalence/cards/conv_bn.py MODEL_SHAPES):

  1. check version 4 against the float64 reference through the harness (check_args: outputs,
     every gradient, the running statistics) at each shape and each of its directions, full
     size, bf16 channels_last; a failure is recorded and that case's version 4 is not timed;
  2. time, in the same process, each shape's directions (eval fwd under no_grad; train
     fwd+bwd with autograd, one upstream gradient): eager cuDNN F.conv2d + F.batch_norm,
     Level 5 version 3 (the default before this version), version 4, and Level 4
     (levels.triton); triton's do_bench, median and p20/p80 over its repetitions.

    PYTHONPATH=. python3 scripts/device_conv_bn5.py OUT.json [--check-only] [--shapes a,b]

Prints a table; writes OUT.json (GPU name, torch/triton/CUDA versions, date, every check and
figure). ~1-2 min on an H100 (the first build of Level 5 included when it is cold).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = "LEVELS_CUDA_VERSION_CONV_BN"
NEW, OLD = 4, 3
QUANTILES = [0.5, 0.2, 0.8]
PARAMS = ("x", "conv_weight", "conv_bias", "bn_weight", "bn_bias")


def _shapes(only):
    from equivalence import cards
    shapes = cards.get("conv_bn").model_shapes
    return [s for s in shapes if not only or s.name in only]


def _args(shape, training, seed=0):
    from equivalence import cards
    a = cards.get("conv_bn").module.make_args(shape.sizes, torch.bfloat16, torch.device("cuda"),
                                              torch.Generator().manual_seed(seed))
    a["training"] = training
    return a


def _check(shape, variant, version):
    """One harness check of `version` at `shape`, as a JSON-able dict."""
    from equivalence.check import check_args

    os.environ[ENV] = str(version)
    start = time.perf_counter()
    try:
        r = check_args("conv_bn", "cuda", _args(shape, variant == "train", seed=1))
        entry = {"status": r.status, "summary": r.summary()}
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        entry = {"status": "error", "summary": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc(limit=4)}
    finally:
        os.environ.pop(ENV, None)
    entry["seconds"] = round(time.perf_counter() - start, 2)
    return entry


def run_checks(shapes, report):
    """Version 4 against float64 at every shape and direction; returns the failed (shape,
    variant) pairs (not timed for version 4). Where version 4 fails, version 3 is checked
    at the same case too: whether the case or the new kernels are at fault."""
    failed = set()
    for s in shapes:
        for variant, _ in s.directions:
            check_case(s, variant, NEW, OLD, report, failed)
    return failed


def check_case(s, variant, new, old, report, failed):
    """Version `new` at shape s in `variant` against float64, into report["checks"]; a
    failure goes into `failed` with version `old` checked at the same case beside it (whether
    the case or the new kernels are at fault)."""
    key = f"{s.name}/{variant}"
    entry = _check(s, variant, new)
    if entry["status"] != "pass":
        failed.add((s.name, variant))
        entry[f"v{old}_same_case"] = _check(s, variant, old)
    report["checks"][key] = entry
    print(f"  {'ok  ' if entry['status'] == 'pass' else 'FAIL'} v{new} {key}: "
          f"{entry['summary'][:150]} ({entry['seconds']} s)", flush=True)
    if f"v{old}_same_case" in entry:
        same = entry[f"v{old}_same_case"]
        print(f"       v{old} at the same case: {same['status']} {same['summary'][:120]}")


def _bench(fn):
    import triton
    torch.cuda.synchronize()
    med, p20, p80 = triton.testing.do_bench(fn, warmup=10, rep=60, quantiles=QUANTILES)
    return {"ms": med, "p20_ms": p20, "p80_ms": p80}


def _callers(a, versions=None):
    """name -> f(params, running_mean, running_var, training) returning the NCHW output.
    versions: the (old, new) Level 5 pair to time (default OLD, NEW; device_conv_bn6 passes its own)."""
    old, new = versions or (OLD, NEW)
    import importlib

    from cuda_kernels import conv_bn as cb

    level4_module = importlib.import_module("levels.triton")

    stride, padding = a["stride"], a["padding"]

    def cudnn(p, rm, rv, training):
        y = F.conv2d(p["x"], p["conv_weight"], p["conv_bias"], stride=stride, padding=padding)
        return F.batch_norm(y, rm, rv, p["bn_weight"], p["bn_bias"], training=training,
                            momentum=a["momentum"], eps=a["eps"])

    def level5(version):
        def call(p, rm, rv, training):
            return cb.conv_bn(p["x"], p["conv_weight"], p["conv_bias"], p["bn_weight"],
                              p["bn_bias"], rm, rv, (stride, stride), (padding, padding),
                              a["eps"], a["momentum"], training, version=version)
        return call

    def level4(p, rm, rv, training):
        return level4_module.conv_bn(p["x"], p["conv_weight"], p["conv_bias"], p["bn_weight"],
                                     p["bn_bias"], rm, rv, stride, padding, a["eps"],
                                     a["momentum"], training)

    return {"cudnn": cudnn, f"level5_v{old}": level5(old), f"level5_v{new}": level5(new),
            "level4": level4}


def cells(figures):
    """One printed row: each candidate's median [p20, p80] and its ratio to cuDNN."""
    out = []
    for name, fig in figures.items():
        if "ms" in fig:
            out.append(f"{name} {fig['ms']:.3f} ms [{fig['p20_ms']:.3f}, {fig['p80_ms']:.3f}]"
                       + (f" {fig['x_cudnn']:.2f}x" if "x_cudnn" in fig else ""))
        else:
            out.append(f"{name} {fig.get('skipped') or fig.get('error')}")
    return " | ".join(out)


def ratios(figures, base_name="cudnn"):
    """x_cudnn of every timed candidate but the baseline: its speed relative to cuDNN's."""
    ref = figures.get(base_name, {}).get("ms")
    for name, fig in figures.items():
        if ref and "ms" in fig and name != base_name:
            fig["x_cudnn"] = ref / fig["ms"]


def time_candidate(fn, params, rm, rv, training, dy):
    """One candidate's figures: a train step (forward + backward through autograd with one
    upstream gradient dy) or an eval forward under no_grad, each run once first so that builds
    and compiles stay outside the timing."""
    if training:
        def step():
            torch.autograd.grad(fn(params, rm, rv, True), list(params.values()), dy)
        step()
        return _bench(step)
    with torch.no_grad():
        fn(params, rm, rv, False)
        return _bench(lambda: fn(params, rm, rv, False))


def run_timings(shapes, failed, report, pick=None, checked=None):
    """Every shape's directions, each candidate of pick(args) (default: _callers(args), cuDNN
    and the version pair) timed in the same process, ratios to cuDNN, a table row printed. The
    candidate named `checked` (default: version NEW) is not timed where its check failed."""
    pick = pick or _callers
    checked = checked or f"level5_v{NEW}"
    for s in shapes:
        for variant, direction in s.directions:
            training = variant == "train"
            a = _args(s, training)
            rm, rv = a["running_mean"].clone(), a["running_var"].clone()
            params = {k: a[k].detach().requires_grad_(training) for k in PARAMS}
            row = {"shape": s.name, "describe": s.describe(), "variant": variant,
                   "direction": direction, "figures": {}}
            dy = None
            for name, fn in pick(a).items():
                if name == checked and (s.name, variant) in failed:
                    row["figures"][name] = {"skipped": "failed its check"}
                    continue
                try:
                    if training and dy is None:
                        with torch.no_grad():
                            dy = torch.randn_like(fn(params, rm, rv, True))
                    row["figures"][name] = time_candidate(fn, params, rm, rv, training, dy)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    row["figures"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            ratios(row["figures"])
            report["timings"].append(row)
            print(f"  {s.name:34s} {variant:5s} {direction:7s} | {cells(row['figures'])}", flush=True)


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


def new_report(sections, versions=(OLD, NEW)):
    """The report's header (GPU, software, date, the pair of versions and their ideas, unless
    versions is None) and an empty list per name in sections, after checks."""
    import triton
    from cuda_kernels import conv_bn as cb
    report = {"gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
              "sms": torch.cuda.get_device_properties(0).multi_processor_count,
              "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if versions is not None:
        report["versions"] = {"old": versions[0], "new": versions[1], "default": cb.DEFAULT_VERSION,
                              "ideas": {str(k): v for k, v in cb.VERSIONS.items()}}
    report.update({"dtype": "bfloat16, channels_last", "timing": "triton do_bench (warmup 10, "
                   "rep 60 ms): median, p20, p80", "checks": {}})
    report.update({name: [] for name in sections})
    return report


def finish(report, out, start, failed, tag):
    report["seconds"] = round(time.perf_counter() - start, 1)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"[{tag}] {len(failed)} failed check(s); {report['seconds']} s; wrote {out}")


def main():
    out, only = parse_args(__doc__)
    from cuda_kernels import build

    report = new_report(("timings",))
    start = time.perf_counter()
    build.ops()
    report["build"] = build.last_build()
    shapes = _shapes(only)
    print(f"[conv_bn5] {report['gpu']}: checks of version {NEW} (float64 reference, full size)")
    failed = run_checks(shapes, report)
    if "--check-only" not in sys.argv:
        print("[conv_bn5] timings (bf16 channels_last; ms median [p20, p80], ratio to cuDNN)")
        run_timings(shapes, failed, report)
    finish(report, out, start, failed, "conv_bn5")

if __name__ == "__main__":
    main()
