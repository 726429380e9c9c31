"""Level 4 (Triton) layer_norm, MLP and conv+BN on the GPU, in one call: harness checks, the
speed goals' benchmarks, explain summaries, GPU tests.

    OUT=/some/dir PYTHONPATH=. python scripts/device_triton_layer_norm_mlp_conv_bn.py [--skip-checks] [--skip-bench] [--skip-tests]

Writes $OUT/device-triton-layer-norm-mlp-conv-bn.json (environment, every check result, the pytest tail, the PTX/SASS
summaries and every benchmark figure) and prints a short table last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from equivalence import environment
from equivalence.commands.bench import goals as bench
from equivalence.check import check
from equivalence.commands.explain import explain

COMPONENTS = ["layer_norm", "mlp", "conv_bn"]


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    report = {"environment": environment.describe(device), "checks": [], "explain": {}}
    t0 = time.time()

    def save():
        (out_dir / "device-triton-layer-norm-mlp-conv-bn.json").write_text(json.dumps(report, indent=1, default=str))

    for comp in ([] if "--skip-checks" in sys.argv else COMPONENTS):
        for dtype in ("float32", "float16", "bfloat16"):
            for size in ("tiny", "small"):
                for r in check(comp, "triton", dtype=dtype, device=device, size=size):
                    report["checks"].append(r.to_dict())
                    w = r.worst
                    print(f"check {comp:10s} {r.variant:7s} {dtype:8s} {size:5s} {r.status:5s} "
                          f"{(w.name + ' %.2e' % w.rel_err) if w else ''} {r.reason}", flush=True)
    save()
    print(f"checks done in {time.time() - t0:.0f}s", flush=True)

    if "--skip-bench" not in sys.argv:
        b = bench.run(COMPONENTS, device)
        report["figures"] = b["figures"]
        report["skipped"] = b["skipped"]
        save()
        print(f"\n{'component':10s} {'figure':28s} {'level':8s} {'dtype':9s} {'ms':>8s} "
              f"{'TF/s':>7s} {'TB/s':>6s} {'ratio':>6s} goal met  baseline")
        for f in b["figures"]:
            print(f"{f['component']:10s} {f['name'][:28]:28s} {f['level']:8s} {f['dtype']:9s} "
                  f"{f['ms']:8.3f} {f['tflops'] or 0:7.1f} {f['tbps'] or 0:6.2f} "
                  f"{f['ratio'] or 0:6.3f} {f['goal'] or '':4} {str(f['met']):5s} {f['baseline'] or ''}")
    for comp in COMPONENTS:
        try:  # explain runs the component (small size, fwd+bwd) before summarizing its kernels
            text = str(explain(comp, "triton", device, dtype="bfloat16"))
            report["explain"][comp] = text[text.find("# ---- compiled on"):]
        except Exception:  # noqa: BLE001 - report and go on to the benchmarks
            report["explain"][comp] = "explain failed:\n" + traceback.format_exc()
        print(report["explain"][comp][:3000], flush=True)
    save()

    if "--skip-tests" not in sys.argv:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                            "tests/test_triton_layer_norm.py", "tests/test_triton_mlp.py",
                            "tests/test_triton_conv_bn.py"], capture_output=True, text=True)
        report["gpu_tests"] = {"returncode": p.returncode, "tail": (p.stdout + p.stderr)[-6000:]}
        print(p.stdout[-1500:], flush=True)
        save()

    bad = [c for c in report["checks"] if c["status"] != "pass"]
    print(f"\n{len(report['checks']) - len(bad)}/{len(report['checks'])} checks pass; "
          f"total {time.time() - t0:.0f}s")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
