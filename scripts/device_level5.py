"""Level 5 on a GPU, in one call: build (cold and warm), ptxas reports, the harness for every
component x version x dtype x layout, opcheck of every op, the GPU tests, the benchmarks.

    PYTHONPATH=. python3 scripts/device_level5.py --out $OUT [--quick] [--budget-s 540]

Writes (flat in --out, at most 6 files): level5.json (everything, rewritten after every
step so a kill loses only the step it interrupted), pytest-gpu.xml (junit of
`pytest -m gpu tests/test_cuda_*.py`), bench.json (equivalence.commands.bench.goals of the Level 5
components), and build-error.txt only if the build fails. Every step runs in try/except;
once the time budget is spent the remaining steps are skipped and the JSON says so.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = ("float32", "float16", "bfloat16")

BUILD_ONCE = """
import json, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from cuda_kernels import build
try:
    build.load()
except build.BuildError as exc:
    print(json.dumps({{"error": str(exc)}}))
    sys.exit(0)
print(json.dumps(build.last_build() | {{"process_s": time.perf_counter() - t0,
                                         "registration_errors": build.registration_errors()}}))
"""


class Run:
    def __init__(self, out: Path, budget_s: float):
        self.out, self.start, self.budget = out, time.monotonic(), budget_s
        self.report: dict = {"steps": {}, "skipped_for_budget": []}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def save(self):
        (self.out / "level5.json").write_text(json.dumps(self.report, indent=1, default=str))

    def step(self, name: str, fn, need_s: float = 10.0):
        if self.left() < need_s:
            print(f"[level5] {name}: skipped ({self.left():.0f} s of the budget left, needs ~{need_s:.0f})",
                  flush=True)
            self.report["skipped_for_budget"].append(name)
            self.save()
            return None
        print(f"[level5] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            result = fn()
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - one failing step must not lose the others
            result, status = {"error": f"{type(exc).__name__}: {exc}",
                              "traceback": traceback.format_exc()[-3000:]}, "error"
        seconds = round(time.monotonic() - t0, 2)
        self.report["steps"][name] = {"status": status, "seconds": seconds, "result": result}
        print(f"[level5] {name}: {status} in {seconds:.0f} s", flush=True)
        self.save()
        return result


def step_environment():
    from equivalence import environment

    from cuda_kernels import build

    info = environment.describe("cuda")
    nvcc = build.find_nvcc()
    info["nvcc"] = nvcc
    if nvcc:
        info["nvcc_version"] = subprocess.run([nvcc, "--version"], capture_output=True,
                                              text=True).stdout.strip().splitlines()[-1]
    info["kernel_files"] = [p.name for p in build.kernel_files()]
    info["binding_fragments"] = [p.name for p in build.binding_fragments()]
    info["component_modules"] = build.component_modules()
    return info


def _build_subprocess(cache: str, timeout: float, builder: str = "files") -> dict:
    env = dict(os.environ, LEVELS_CUDA_CACHE=cache, LEVELS_CUDA_BUILDER=builder)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", BUILD_ONCE.format(root=str(ROOT))], capture_output=True,
                       text=True, env=env, timeout=timeout)
    lines = p.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": f"no output (rc {p.returncode})"}
    result.update(wall_s=round(time.perf_counter() - t0, 2), rc=p.returncode, stderr=p.stderr[-3000:])
    return result


def step_build(run: Run, cache: str, builder: str, other: str | None):
    """A cold build by two processes started together into one empty cache (both must
    succeed: one builds, the other waits on the lock and loads the result), a warm load,
    a cold build with `other` for comparison (its own directory), then a load into this
    process."""
    from concurrent.futures import ThreadPoolExecutor

    timeout = max(60.0, run.left() - 30)
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: _build_subprocess(cache, timeout, builder), range(2)))
    errors = [b for b in both if "error" in b]
    if errors:
        (run.out / "build-error.txt").write_text(errors[0]["error"])
        return {"cold": errors[0], "concurrent": both}
    # The one that did not wait for the lock built; its time is the cold build's.
    cold = min(both, key=lambda b: b.get("waited_for_lock_s", 0.0))
    warm = _build_subprocess(cache, timeout=120, builder=builder)
    compared = (_build_subprocess(tempfile.mkdtemp(prefix="levels-cuda-other-"),
                                  timeout=max(60.0, run.left() - 60), builder=other)
                if other else None)
    from cuda_kernels import build

    t0 = time.perf_counter()
    build.load(cache=cache, builder=builder)  # this process loads the same (warm) build
    in_process = build.last_build() | {"load_s": round(time.perf_counter() - t0, 3),
                                       "registration_errors": build.registration_errors()}
    return {"builder": builder, "cold": cold, "concurrent": both, "warm": warm,
            "this_process": in_process,
            "cold_with_other_builder": {"builder": other, **(compared or {})},
            "goals": {"cold_le_20s": cold.get("seconds", 1e9) <= 20,
                      "warm_le_1s": warm.get("seconds", 1e9) <= 1,
                      "two_processes_both_succeed": len(both) == 2 and not errors}}


# What ncu profiles: one kernel of each component at its bench shape (equivalence/cards),
# after a warm-up call, with the clocks left alone (METHOD.md).
NCU_TARGET = """
import sys, torch
sys.path.insert(0, {root!r})
from equivalence import cards
component = {component!r}
spec = cards.get(component.removesuffix("_bwd"))
args = spec.module.make_args(spec.sizes["bench"], torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
if component == "mlp":
    from cuda_kernels import mlp as k
    x = args["x"].reshape(-1, args["x"].shape[-1])
    call = lambda: k.gemm(x, args["w1"].t(), args["b1"], epilogue="gelu_save", version={version})
elif component == "conv_bn":
    from cuda_kernels import conv_bn as k
    a = args
    call = lambda: k.conv_bn(a["x"], a["conv_weight"], a["conv_bias"], a["bn_weight"], a["bn_bias"],
                             a["running_mean"], a["running_var"], (a["stride"],) * 2, (a["padding"],) * 2,
                             a["eps"], a["momentum"], False, version={version})
elif component == "attention":
    from cuda_kernels import attention as k
    q, kk, v = args["q"], args["k"], args["v"]
    call = lambda: k.attention(q, kk, v, False, q.shape[-1] ** -0.5, version={version})
elif component == "attention_bwd":
    from cuda_kernels import attention as k
    q, kk, v = (args[n].requires_grad_() for n in ("q", "k", "v"))
    def call():
        with torch.enable_grad():
            k.attention(q, kk, v, False, q.shape[-1] ** -0.5, version={version}).sum().backward()
elif component == "lstm":
    from cuda_kernels import lstm as k
    a = args
    call = lambda: k.lstm(a["x"], a["h0"], a["c0"], a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"], version={version})
else:
    from cuda_kernels import layer_norm as k
    call = lambda: k.layer_norm(args["x"], args["weight"], args["bias"], args["eps"])
with torch.no_grad():
    for _ in range(3):
        call()
torch.cuda.synchronize()
"""

NCU_KERNELS = {  # label: (component, kernel-name regex, version)
    "mlp v5": ("mlp", "gemm_v5_kernel", 5), "mlp v4": ("mlp", "gemm_v4_kernel", 4),
    "conv_bn v3": ("conv_bn", "conv_kernel", 3), "layer_norm v3": ("layer_norm", "fwd_v3", 3),
    "attention v4": ("attention", "attn_fwd_mma_kernel", 4),
    "attention v5": ("attention", "attn_fwd_v5_kernel", 5),
    "attention bwd v4": ("attention_bwd", "attn_bwd_dkdv_mma_kernel", 4),
    "attention bwd dq v4": ("attention_bwd", "attn_bwd_dq_mma_kernel", 4),
    "attention bwd v7": ("attention_bwd", "attn_bwd_fused_kernel", 7),
    "lstm v2": ("lstm", "lstm_fwd_persistent_v2", 2)}
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
                "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")


def step_ncu(run: Run, only=()):
    """Hardware counters of the kernel each speed goal depends on (the last warm call)."""
    import csv
    import io
    import shutil

    ncu = shutil.which("ncu") or next(iter(glob.glob("/opt/nvidia/nsight-compute/*/ncu")), None)
    if not ncu:
        return {"error": "ncu not found"}
    results = {}
    for component, (comp, kernel, version) in NCU_KERNELS.items():
        if (only and component not in only) or (ONLY and comp.removesuffix("_bwd") not in ONLY):
            continue
        if run.left() < 40:
            results[component] = {"skipped": "budget"}
            continue
        cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "-k", f"regex:{kernel}",
               "-s", "2", "-c", "1", *[a for sec in NCU_SECTIONS for a in ("--section", sec)],
               "--page", "details", "--csv", sys.executable, "-c",
               NCU_TARGET.format(root=str(ROOT), component=comp, version=version)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=min(180.0, run.left() - 20),
                               env=dict(os.environ))
        except subprocess.TimeoutExpired:
            results[component] = {"error": "timed out"}
            continue
        rows = [r for r in csv.reader(io.StringIO(p.stdout)) if len(r) > 4]
        if not rows or rows[0][0] != "ID":
            results[component] = {"rc": p.returncode, "tail": (p.stdout + p.stderr)[-2500:]}
            continue
        head = rows[0]
        col = {name: head.index(name) for name in ("Kernel Name", "Section Name", "Metric Name",
                                                   "Metric Unit", "Metric Value")}
        metrics = [{"section": r[col["Section Name"]], "metric": r[col["Metric Name"]],
                    "unit": r[col["Metric Unit"]], "value": r[col["Metric Value"]]} for r in rows[1:]]
        results[component] = {"kernel": rows[1][col["Kernel Name"]][:200], "metrics": metrics}
    return results


# Build-time knobs (macros in the .cu files), each variant built into its own cache and
# timed at the bench shapes against the baselines timed in the same process.
SWEEP_VARIANTS = {
    "default": "",
    "conv v3 stages=4": "-DLEVELS_CONV_V3_STAGES=4",
    "conv v3 stages=5": "-DLEVELS_CONV_V3_STAGES=5",
    "gemm v5 stages=3": "-DLEVELS_GEMM_V5_STAGES=3",
}

SWEEP_TIMER = """
import json, sys, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
from equivalence import cards
from equivalence.timing import time_fn
from cuda_kernels import build, conv_bn as kc, mlp as km
build.load()
out = {{"build": build.last_build()}}
g = torch.Generator().manual_seed(0)
spec = cards.get("conv_bn")
a = spec.module.make_args(spec.sizes["bench"], torch.bfloat16, "cuda", g)
st, pd = (a["stride"],) * 2, (a["padding"],) * 2
def conv(v):
    return lambda: kc.conv_bn(a["x"], a["conv_weight"], a["conv_bias"], a["bn_weight"], a["bn_bias"],
                              a["running_mean"], a["running_var"], st, pd, a["eps"], a["momentum"], False, version=v)
def cudnn():
    y = F.conv2d(a["x"], a["conv_weight"], a["conv_bias"], stride=st, padding=pd)
    return F.batch_norm(y, a["running_mean"], a["running_var"], a["bn_weight"], a["bn_bias"], training=False, eps=a["eps"])
spec = cards.get("mlp")
m = spec.module.make_args(spec.sizes["bench"], torch.bfloat16, "cuda", g)
t = [m[n] for n in ("x", "w1", "b1", "w2", "b2")]
def eager():
    return F.linear(F.gelu(F.linear(t[0], t[1], t[2])), t[3], t[4])
with torch.no_grad():
    for name, fn in (("conv v3", conv(3)), ("cudnn conv+bn", cudnn), ("mlp v5", lambda: km.mlp(*t, version=5)),
                     ("mlp v4", lambda: km.mlp(*t, version=4)), ("eager mlp", eager)):
        fn()
        out[name + " ms"] = time_fn(fn, "cuda").median_ms
out["conv v3 / cudnn"] = out["cudnn conv+bn ms"] / out["conv v3 ms"]
out["mlp v5 / eager"] = out["eager mlp ms"] / out["mlp v5 ms"]
print(json.dumps(out))
"""


def step_sweep(run: Run, only=()):
    results = {}
    for name, flags in SWEEP_VARIANTS.items():
        if only and name not in only:
            continue
        if run.left() < 45:
            results[name] = {"skipped": "budget"}
            continue
        env = dict(os.environ, LEVELS_CUDA_CACHE=tempfile.mkdtemp(prefix="levels-sweep-"),
                   LEVELS_CUDA_NVCC_FLAGS=flags)
        try:
            p = subprocess.run([sys.executable, "-c", SWEEP_TIMER.format(root=str(ROOT))], capture_output=True,
                               text=True, env=env, timeout=min(240.0, run.left() - 10))
            lines = p.stdout.strip().splitlines()
            results[name] = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                "rc": p.returncode, "tail": (p.stdout + p.stderr)[-2000:]}
        except subprocess.TimeoutExpired:
            results[name] = {"error": "timed out"}
        results[name]["flags"] = flags
    return results


def step_ptxas():
    from cuda_kernels import build

    return {p.name: build.ptxas_report(p) for p in build.kernel_files()}


ONLY: tuple = ()  # --only: the components this run checks (all with kernels when empty)


def _components():
    import levels

    cuda = levels.get("cuda")
    return [c for c in levels.COMPONENTS if cuda.has_kernels(c) and (not ONLY or c in ONLY)]


def _versions(component: str) -> list[int]:
    import importlib

    module = importlib.import_module(f"cuda_kernels.{component}")
    return sorted(getattr(module, "VERSIONS", {getattr(module, "DEFAULT_VERSION", 1): ""}))


def _layouts() -> list[str]:
    try:
        from equivalence import cards
        return list(getattr(cards, "LAYOUTS", ("contiguous",)))
    except Exception:  # noqa: BLE001
        return ["contiguous"]


def _at_version(component: str, version: int):
    """Level 5's `component` at `version`, the version passed as an argument: the kernels'
    entry (cuda_kernels.<component>.<component>(..., version=)) behind what levels.cuda does
    first, the contract's validation (the harness's own wrapper of fn=) and its int pairs
    for conv_bn's stride and padding."""
    import importlib

    from levels.contract import VALIDATORS

    entry = getattr(importlib.import_module(f"cuda_kernels.{component}"), component)

    def call(**args):
        normalized = VALIDATORS[component](**args)
        args.update({k: normalized[k] for k in ("stride", "padding") if k in args})
        return entry(**args, version=version)
    call.__name__ = f"cuda_{component}_v{version}"
    return call


def _check(component, dtype, size, layout, version):
    import levels
    from equivalence.check import check

    cuda = levels.get("cuda")
    return check(component, dtype=dtype, device="cuda", size=size, layout=layout,
                 fn=_at_version(component, version), uses_tf32=cuda.uses_tf32)


def step_harness(run: Run, quick: bool):
    size = "tiny" if quick else "small"
    rows, counts = [], {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    for c in _components():
        for version in _versions(c):
            for dtype in DTYPES:
                for layout in _layouts():
                    if run.left() < 60:
                        rows.append({"component": c, "version": version, "note": "budget: stopped here"})
                        return {"size": size, "counts": counts, "results": rows}
                    try:
                        results = _check(c, dtype, size, layout, version)
                    except Exception as exc:  # noqa: BLE001
                        rows.append({"component": c, "version": version, "dtype": dtype, "layout": layout,
                                     "status": "error", "reason": f"{type(exc).__name__}: {exc}"})
                        counts["error"] += 1
                        continue
                    for r in results:
                        w = r.worst
                        counts[r.status] = counts.get(r.status, 0) + 1
                        rows.append({"component": c, "version": version, "dtype": dtype,
                                     "layout": getattr(r, "layout", layout), "variant": r.variant,
                                     "status": r.status, "reason": r.reason[:2000], "tf32": r.tf32,
                                     "tolerance": r.tolerance, "seed": r.seed,
                                     "worst": None if w is None else [w.name, w.rel_err, w.max_abs_err],
                                     "failed": [[x.name, x.rel_err, x.problem] for x in r.comparisons
                                                if not x.ok]})
                        print(f"  {c} v{version} {dtype} {layout} {r.variant}: {r.status}"
                              + (f" ({r.summary()[:200]})" if r.status != "pass" else ""), flush=True)
    return {"size": size, "counts": counts, "results": rows}


def _capture_op_calls(fn, namespace: str = "levels_cuda"):
    """Run fn; return {op: (args, kwargs)} of the first call of every levels_cuda op, with
    tensors cloned (strides kept) so opcheck can replay them."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: dict = {}

    def keep(v):
        if isinstance(v, torch.Tensor):
            v = v.detach()
            try:  # the same strides (a view's layout is part of what opcheck should see)
                return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device).copy_(v)
            except RuntimeError:  # overlapping strides (expand): a plain copy
                return v.clone()
        if isinstance(v, (list, tuple)):
            return type(v)(keep(x) for x in v)
        return v

    class Capture(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == namespace and func not in seen:
                seen[func] = (keep(args), keep(kwargs))
            return func(*args, **kwargs)

    with Capture():
        fn()
    return seen


def step_opcheck(run: Run):
    import torch

    from equivalence import cards
    from equivalence.check import _prepare, flatten

    rows = []
    for c in _components():
        for version in _versions(c):
            for dtype in (torch.float32, torch.bfloat16):
                if run.left() < 60:
                    rows.append({"component": c, "note": "budget: stopped here"})
                    return rows
                try:
                    spec = cards.get(c)
                    at_version = _at_version(c, version)  # the version as the call's argument
                    for variant in spec.variants:
                        case = spec.case("tiny", variant, dtype, "cuda", seed=0)

                        def call():
                            args, _ = _prepare(case)
                            outs = [o for o in flatten(at_version(**args))[:case.n_returned]
                                    if isinstance(o, torch.Tensor) and o.requires_grad]
                            if outs:
                                torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])

                        calls = _capture_op_calls(call)
                        for op, (args, kwargs) in calls.items():
                            name = str(op)
                            # forward ops are checked with grads on their non-mutated float inputs
                            # (autograd registration); backward ops without (they have none)
                            if not any(w in name for w in ("bwd", "backward", "grad")):
                                schema_args = op._schema.arguments
                                args = list(args)
                                for i, a in enumerate(args):
                                    mutated = i < len(schema_args) and schema_args[i].alias_info is not None \
                                        and schema_args[i].alias_info.is_write
                                    if isinstance(a, torch.Tensor) and a.is_floating_point() and not mutated:
                                        args[i] = a.detach().requires_grad_()
                                args = tuple(args)
                            try:
                                torch.library.opcheck(op, args, kwargs)
                                status, why = "pass", ""
                            except Exception as exc:  # noqa: BLE001
                                status, why = "fail", f"{type(exc).__name__}: {str(exc)[:1500]}"
                            rows.append({"component": c, "version": version, "dtype": str(dtype),
                                         "variant": variant, "op": name, "status": status, "reason": why})
                            print(f"  opcheck {name} v{version} {dtype} {variant}: {status}", flush=True)
                except Exception as exc:  # noqa: BLE001
                    rows.append({"component": c, "version": version, "dtype": str(dtype), "status": "error",
                                 "reason": f"{type(exc).__name__}: {exc}"})
    return rows


def step_pytest(run: Run, k: str = ""):
    files = sorted(glob.glob(str(ROOT / "tests" / "test_cuda_*.py")))
    if ONLY:  # the components' own test files, plus the build/version tests every component joins
        keep = {f"test_cuda_{c}.py" for c in ONLY} | {"test_cuda_build.py", "test_cuda_versions.py"}
        files = [f for f in files if Path(f).name in keep]
    xml = run.out / "pytest-gpu.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           f"--junitxml={xml}", *(["-k", k] if k else []), *files]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                           timeout=max(30.0, run.left() - 45))
        tail, rc = (p.stdout + p.stderr)[-4000:], p.returncode
    except subprocess.TimeoutExpired as exc:
        tail, rc = f"timed out after {exc.timeout:.0f} s\n{(exc.stdout or b'')[-2000:]!r}", None
    summary = {"rc": rc, "files": [Path(f).name for f in files], "tail": tail}
    if xml.exists():
        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        summary.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        summary["time_s"] = float(suite.get("time", 0))
        summary["not_passed"] = []
        for case in suite.iter("testcase"):
            for kind in ("failure", "error"):
                el = case.find(kind)
                if el is not None:
                    summary["not_passed"].append({"test": f"{case.get('classname')}::{case.get('name')}",
                                                  "kind": kind, "message": (el.get("message") or "")[:600]})
    return summary


def step_bench(run: Run, only=()):
    comps = [c for c in _components() if not only or c in only]
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from equivalence.commands.bench import goals as bench; "
            f"bench.run({comps!r}, 'cuda', {str(run.out)!r})")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                           timeout=max(30.0, run.left() - 10))
        rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = None, f"timed out after {exc.timeout:.0f} s"
    path = run.out / "bench.json"
    if not path.exists():
        return {"rc": rc, "tail": tail, "figures": []}
    report = json.loads(path.read_text())
    figures = [f for f in report["figures"] if f["level"] == "cuda" or "cuda" in f["name"].lower()]
    short = [{k: f.get(k) for k in ("component", "name", "level", "dtype", "ms", "tflops", "tbps",
                                     "baseline", "ratio", "goal", "met")} for f in report["figures"]]
    return {"rc": rc, "tail": tail if rc else "", "level5_figures": len(figures), "figures": short,
            "skipped": report.get("skipped")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory ($OUT)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, no benchmarks")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting steps after this")
    parser.add_argument("--builder", default="files", help="LEVELS_CUDA_BUILDER for the run")
    parser.add_argument("--compare-builder", default="", help="also time a cold build with this one")
    parser.add_argument("--skip", default="", help="comma-separated steps to skip (ptxas, harness, "
                                                   "opcheck, pytest_gpu, bench, ncu)")
    parser.add_argument("--tests", default="", help="pytest -k expression for the GPU tests")
    parser.add_argument("--sweep", default="", help="build-time knob variants to time: 'all' or "
                                                    "names of SWEEP_VARIANTS (comma-separated)")
    parser.add_argument("--components", default="", help="bench only these (comma-separated)")
    parser.add_argument("--only", default="", help="harness, opcheck, GPU tests and bench of only these "
                                                   "components (comma-separated)")
    parser.add_argument("--ncu", default="", help="ncu only these labels of NCU_KERNELS (comma-separated)")
    args = parser.parse_args(argv)
    global ONLY
    ONLY = tuple(c for c in args.only.split(",") if c)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, args.budget_s)
    run.report["args"] = vars(args)
    cache = tempfile.mkdtemp(prefix="levels-cuda-cache-")  # cold: nothing cached (not under $OUT)

    import torch
    if not torch.cuda.is_available():
        run.report["error"] = "no CUDA GPU here: this script is for the device"
        run.save()
        print("[level5] no CUDA GPU", flush=True)
        return 1
    run.step("environment", step_environment, need_s=1)
    built = run.step("build", lambda: step_build(run, cache, args.builder,
                                                 args.compare_builder or None), need_s=60)
    skip = set(filter(None, args.skip.split(",")))
    step = run.step
    run.step = lambda name, fn, need_s=10.0: (None if name in skip else step(name, fn, need_s))
    ok = bool(built) and "error" not in built.get("cold", {"error": 1}) and "this_process" in built
    run.step("ptxas", step_ptxas, need_s=20)
    if ok:
        run.step("harness", lambda: step_harness(run, args.quick), need_s=60)
        run.step("opcheck", lambda: step_opcheck(run), need_s=60)
    else:
        run.report["skipped_after_build_failure"] = ["harness", "opcheck"]
    run.step("pytest_gpu", lambda: step_pytest(run, args.tests), need_s=90)
    if ok and not args.quick:
        run.step("bench", lambda: step_bench(run, [c for c in args.components.split(",") if c]), need_s=60)
    if ok and args.sweep:
        run.step("sweep", lambda: step_sweep(run, [x for x in args.sweep.split(",") if x and x != "all"]),
                 need_s=45)
    if ok:
        run.step("ncu", lambda: step_ncu(run, [x for x in args.ncu.split(",") if x]), need_s=40)
    run.report["total_s"] = round(time.monotonic() - run.start, 1)
    run.save()
    print(f"[level5] done in {run.report['total_s']:.0f} s; wrote {out / 'level5.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
