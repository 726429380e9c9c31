"""The first call at a new shape, with and without compiling ahead (the first-call goal).

    PYTHONPATH=. python3 scripts/probe_first_calls.py [--out reports/h100-first-calls.json]

Each measurement is its own process with an empty Triton cache (cold: every kernel is
compiled), so nothing one run compiled helps the next: Level 4's first forward+backward
at `compare`'s bench shapes and at the model-suite shapes whose first calls were slowest,
with LEVELS_TRITON_COMPILE_AHEAD=0 (each kernel compiled when the call reaches it) and =1
(triton_kernels/launch.py: all of them at once, in threads). Off and on alternate per
shape, so a drift of the machine hits both. A second call shows the warm time. Triton's
start-up in a new process (its driver, one trivial kernel) is timed before, apart.

    PYTHONPATH=. python3 scripts/probe_first_calls.py --autotune --out reports/h100-first-calls-autotune.json

LEVELS_TRITON_AUTOTUNE=1 instead (triton_kernels/tuning.py): each shape's first call in a
fresh process with empty caches (it times candidate tiles), then in a second process that
finds the tile cache and Triton's cache the first one left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CASES = [("attention", "bench"), ("layer_norm", "bench"), ("mlp", "bench"), ("lstm", "bench"),
         ("conv_bn", "bench"),
         ("mlp", "gpt2-small-train"), ("attention", "gpt2-small-train"),
         ("lstm", "gnmt-train"), ("conv_bn", "resnet50-stem")]


def _touch_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def touch(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1.0)
    return touch


def child(component: str, where: str) -> dict:
    import torch

    import levels.triton as L4
    from equivalence import cards, shapes
    from equivalence.check import flatten

    spec = cards.get(component)
    if where in spec.sizes:
        sizes, variant, dtype = spec.sizes[where], next(iter(spec.variants)), torch.bfloat16
    else:
        shape = shapes.get(component, where)
        sizes, dtype = shape.sizes, getattr(torch, shape.dtype)
        variant = next(v for v, p in shape.directions if p == "fwd+bwd")
    case = spec.case(sizes, variant, dtype, "cuda", seed=0)
    args = dict(case.args)
    for name in case.differentiable:
        if args.get(name) is not None:
            args[name] = args[name].detach().requires_grad_()
    inputs = [args[n] for n in case.differentiable if args.get(n) is not None]
    fn = getattr(L4, component)
    grads = None
    # Triton's own start-up in a new process (its driver, one trivial kernel compiled or
    # loaded), timed apart: it is paid once per process, not per shape.
    start = time.perf_counter()
    _touch_kernel()[(1,)](torch.zeros(1, device="cuda"))
    torch.cuda.synchronize()
    startup_ms = (time.perf_counter() - start) * 1e3

    def call():
        nonlocal grads
        out = flatten(fn(**args))[:case.n_returned]
        if grads is None:
            grads = [torch.randn_like(o) for o in out]
        torch.autograd.grad(out, inputs, grads)

    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    from triton_kernels import launch
    return {"first_ms": round(times[0], 1), "second_ms": round(times[1], 2),
            "triton_startup_ms": round(startup_ms, 1),
            "variant": variant, "sizes": {k: list(v) if isinstance(v, tuple) else v
                                          for k, v in sizes.items()},
            "compile_threads": launch.COMPILE_THREADS}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="reports/h100-first-calls.json")
    ap.add_argument("--child", nargs=2)
    ap.add_argument("--autotune", action="store_true")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(*a.child)), flush=True)
        return
    import platform

    import torch
    import triton
    if not torch.cuda.is_available():
        print("probe_first_calls: needs a CUDA GPU (it times Triton compiling for one); the "
              "recorded H100 runs are reports/h100-first-calls.json and "
              "reports/h100-first-calls-autotune.json", file=sys.stderr)
        sys.exit(3)

    def measure(component, where, env):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", component, where],
                              env=dict(os.environ, **env), capture_output=True, text=True,
                              timeout=300)
        wall = time.perf_counter() - start
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not line:
            return {"error": (proc.stderr or proc.stdout)[-800:]}
        return dict(json.loads(line[0][7:]), process_s=round(wall, 1))

    rows = []
    for component, where in CASES:
        row = {"component": component, "shape": where}
        if a.autotune:  # cold, then a second process finding both caches
            names = ("cold", "second_process")
            with tempfile.TemporaryDirectory() as cache:
                env = dict(TRITON_CACHE_DIR=f"{cache}/triton", LEVELS_CACHE_DIR=f"{cache}/levels",
                           LEVELS_TRITON_AUTOTUNE="1")
                for name in names:
                    row[name] = measure(component, where, env)
        else:
            names = ("in_turn", "ahead")
            for name, ahead in zip(names, ("0", "1")):
                with tempfile.TemporaryDirectory() as cache:
                    row[name] = measure(component, where, dict(
                        TRITON_CACHE_DIR=cache, LEVELS_TRITON_COMPILE_AHEAD=ahead))
        if all("first_ms" in row[n] for n in names):
            row["speedup"] = round(row[names[0]]["first_ms"] / row[names[1]]["first_ms"], 2)
        print(component, where, {k: row[k].get("first_ms") if isinstance(row[k], dict) else row[k]
                                 for k in (*names, "speedup") if k in row}, flush=True)
        rows.append(row)
    report = {
        "what": ("Level 4's first forward+backward at a new shape with LEVELS_TRITON_AUTOTUNE=1: "
                 "cold (empty Triton and tile caches: candidates timed), then a second process "
                 "finding both caches" if a.autotune else
                 "Level 4's first forward+backward at a new shape, cold Triton cache, one "
                 "process per measurement: kernels compiled in turn "
                 "(LEVELS_TRITON_COMPILE_AHEAD=0) and compiled ahead, all at once in threads (=1)"),
        "command": "PYTHONPATH=. python3 scripts/probe_first_calls.py" + (" --autotune" * a.autotune),
        "gpu": torch.cuda.get_device_name(0), "cpu_threads": os.cpu_count(),
        "versions": f"torch {torch.__version__}, triton {triton.__version__}, "
                    f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
