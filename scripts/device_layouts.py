"""Both layouts on the GPU, in one call: every level that is quick to check (1, 2, 4)
in both layouts (contiguous and strided) at fp32/fp16/bf16, the widest layer_norm row
(MAX_WIDTH: registers and spills, measured), and the GPU-marked tests of Level 4 and of
the layouts.

    OUT=dir PYTHONPATH=. python3 scripts/device_layouts.py [--budget-s 560] [--levels triton,...]
        [--dtypes float32,...] [--sizes tiny,small] [--tests FILE,...] [--skip-max-width]

Writes $OUT/layouts.json (environment, every check, the MAX_WIDTH figures, the pytest
summary) and $OUT/pytest-gpu.xml; prints a short table last. Each step stops when the
budget is spent, and says so, instead of losing what the others measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

import levels
from equivalence import environment
from equivalence.check import check


def _max_width(report: dict, device) -> None:
    """layer_norm at the widest rows Level 4 accepts: correct? spilling? how fast?"""
    import triton_kernels.layer_norm as kernels
    from equivalence.timing import time_fn
    from levels.triton import _compiled

    L4 = levels.get("triton")
    for N in (16384, 65536):
        for dtype in (torch.float32, torch.bfloat16):
            rows = 2048
            x = torch.randn(rows, N, device=device, dtype=dtype)
            w = torch.rand(N, device=device, dtype=dtype) + 0.5
            b = torch.randn(N, device=device, dtype=dtype)
            r = check("layer_norm", "triton", dtype=dtype, device=device,
                      size={"rows": (67,), "N": N}, layout="contiguous")[0]
            with torch.no_grad():
                t = time_fn(lambda: L4.layer_norm(x, w, b), device, prime=True)
            summary = [dict(regs=ck.n_regs, spills=ck.n_spills, warps=ck.metadata.num_warps)
                       for ck in _compiled(kernels.layer_norm_fwd_kernel, device)]
            report["max_width"].append(dict(
                N=N, dtype=str(dtype), check=r.status, worst=r.worst.rel_err if r.worst else None,
                ms=t.median_ms, tbps=2 * x.numel() * x.element_size() / (t.median_ms * 1e-3) / 1e12,
                compiled_forward_kernels=summary))
            print(f"max width N={N} {dtype}: {r.status} {t.median_ms:.3f} ms "
                  f"{report['max_width'][-1]['tbps']:.2f} TB/s kernels={summary}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=560)
    parser.add_argument("--levels", default="triton,native,torchscript")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--tests", default=",".join(
        f"tests/test_triton_{c}.py" for c in ("layer_norm", "mlp", "conv_bn", "attention", "lstm")))
    parser.add_argument("--skip-max-width", action="store_true")
    parser.add_argument("--tests-reserve-s", type=float, default=300,
                        help="stop the checks when less than this is left for the tests")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    start = time.time()
    left = lambda: args.budget_s - (time.time() - start)  # noqa: E731
    report = {"environment": environment.describe(device), "checks": [], "max_width": [],
              "skipped_steps": [], "command": "OUT=dir PYTHONPATH=. python3 scripts/device_layouts.py"}

    def save():
        (out / "layouts.json").write_text(json.dumps(report, indent=1, default=str))

    for level in args.levels.split(","):
        for dtype in args.dtypes.split(","):
            for size in args.sizes.split(","):
                if left() < args.tests_reserve_s:
                    report["skipped_steps"].append(f"checks {level} {dtype} {size}: budget")
                    continue
                for r in check(level=level, dtype=dtype, device=device, size=size):
                    report["checks"].append(r.to_dict())
                    if not r.passed:
                        print("  " + r.summary(), flush=True)
                done = [c for c in report["checks"] if c["level"] == level and c["dtype"] == dtype
                        and c["size"] == size]
                print(f"checks {level:11s} {dtype:8s} {size:5s}: "
                      f"{sum(c['status'] == 'pass' for c in done)}/{len(done)} pass "
                      f"({time.time() - start:.0f} s)", flush=True)
                save()
    try:
        if not args.skip_max_width:
            _max_width(report, device)
    except Exception as exc:  # noqa: BLE001 - keep the rest of the run
        report["max_width"].append({"error": f"{type(exc).__name__}: {exc}"})
    save()

    tests = [t for t in args.tests.split(",") if t]
    if not tests:  # pytest with no path would run every gpu-marked test of the repo
        save()
        return _summary(report, start)
    limit = max(30, int(left()))
    cmd = [sys.executable, "-m", "pytest", "-v", "-m", "gpu", *tests, "-p", "no:cacheprovider",
           "-rf", f"--junitxml={out / 'pytest-gpu.xml'}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        tail = (proc.stdout + proc.stderr)[-4000:]
        report["pytest"] = {"command": " ".join(cmd[1:]), "exit": proc.returncode, "tail": tail}
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        report["pytest"] = {"command": " ".join(cmd[1:]), "exit": "timeout after %d s" % limit,
                            "tail": stdout[-4000:]}
    xml = out / "pytest-gpu.xml"
    if xml.exists():
        cases = ET.parse(xml).getroot().iter("testcase")
        report["pytest"]["cases"] = [
            {"name": c.get("classname", "") + "::" + c.get("name", ""), "seconds": float(c.get("time", 0)),
             "outcome": "failed" if c.find("failure") is not None or c.find("error") is not None
             else ("skipped" if c.find("skipped") is not None else "passed")} for c in cases]
    save()
    print(report["pytest"]["tail"][-1500:])
    return _summary(report, start)


def _summary(report: dict, start: float) -> int:
    n = len(report["checks"])
    passed = sum(c["status"] == "pass" for c in report["checks"])
    print(f"\nchecks: {passed}/{n} pass; skipped steps: {report['skipped_steps']}; "
          f"total {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
