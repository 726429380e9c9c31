"""Level 5 newton_schulz version 2 on a GPU (issue #31): correctness, then speed.

    python scripts/device_newton_schulz5.py OUT.json

1. Builds Level 5, checks version 2 against the float64 reference (the harness's check_args:
   the card's bound per dtype) at a few shapes: fp16 and bf16, 2-D and batched, wide and tall,
   odd sizes.
2. Times (triton.testing.do_bench, median ms) bf16, five steps: native (Level 1), Level 4,
   Level 5 version 1 (1024^2 only: it runs at CUDA-core speed) and version 2 at 1024^2,
   4096^2 and 4096x11008; and version 2's symmetric product alone (cuda_kernels.newton_schulz
   .gram: X X^T, one triangle of tiles, mirrored) against torch.matmul(X, X.T) at 4096x4096
   and 8192x4096.
Writes the GPU's name, the versions and every figure to OUT.json and prints a table.
Under ~150 s on an H100 (most of it the cold build).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton.testing

import levels
from cuda_kernels import build
from cuda_kernels import newton_schulz as K5
from equivalence import cards
from equivalence.cards import newton_schulz as card
from equivalence.check import check_args

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
CHECKS = [  # (shape, dtype)
    ((33, 70), torch.bfloat16), ((1000, 100), torch.float16), ((257, 513), torch.bfloat16),
    ((3, 129, 70), torch.float16), ((4, 768, 2304), torch.bfloat16), ((2, 1000, 300), torch.bfloat16),
    ((1024, 1024), torch.float16),
]
SHAPES = ((1024, 1024), (4096, 4096), (4096, 11008))
GRAM = ((4096, 4096), (8192, 4096))


def flops(shape, steps=5):
    m, n = min(shape), max(shape)
    return steps * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n)  # X X^T, A A, B X (full GEMMs)


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main(out_path: str) -> int:
    t0 = time.time()
    build.load()
    report = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
              "versions": {str(k): v for k, v in K5.VERSIONS.items()}, "default_version": K5.default_version(),
              "build": build.last_build(), "checks": [], "times_ms": {}, "gram_ms": {}}
    print(f"{report['gpu']}: build {report['build'].get('seconds')} s")

    ok = True
    g = torch.Generator().manual_seed(0)
    for shape, dtype in CHECKS:
        G = cards.randn(shape, g, dtype, "cuda")
        os.environ[K5.ENV_VERSION] = "2"  # the harness calls the level: version 2 explicitly
        try:
            r = check_args("newton_schulz", "cuda", dict(G=G, steps=5, coefficients=COEFFICIENTS, eps=1e-7))
        finally:
            del os.environ[K5.ENV_VERSION]
        ours = K5.newton_schulz(G, 5, *COEFFICIENTS, 1e-7, version=2).double()
        ref = card.reference(G.double(), 5, COEFFICIENTS, 1e-7)[0]
        rel = ((ours - ref).norm() / ref.norm()).item()
        row = {"shape": list(shape), "dtype": str(dtype), "passed": r.passed, "summary": r.summary(),
               "v2_rel_err": rel}
        ok &= r.passed
        report["checks"].append(row)
        print(f"check {str(shape):18s} {str(dtype):15s} {'pass' if r.passed else 'FAIL'}  "
              f"v2 rel err {rel:.2e}")

    native, triton_level = levels.get("native").newton_schulz, levels.get("triton").newton_schulz
    print(f"\n{'shape':14s} {'native':>9s} {'level4':>9s} {'v1':>9s} {'v2':>9s} {'v2/native':>9s} {'v2 TF/s':>8s}")
    for shape in SHAPES:
        G = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        t = {"native": bench(lambda: native(G)), "level4": bench(lambda: triton_level(G)),
             "v2": bench(lambda: K5.newton_schulz(G, 5, *COEFFICIENTS, 1e-7, version=2))}
        if shape == (1024, 1024):
            t["v1"] = bench(lambda: K5.newton_schulz(G, 5, *COEFFICIENTS, 1e-7, version=1))
        t["v2_speedup_vs_native"] = t["native"] / t["v2"]
        t["level4_speedup_vs_native"] = t["native"] / t["level4"]
        t["v2_tflops"] = flops(shape) / t["v2"] / 1e9
        report["times_ms"]["x".join(map(str, shape))] = t
        print(f"{'x'.join(map(str, shape)):14s} {t['native']:9.3f} {t['level4']:9.3f} "
              f"{t.get('v1', float('nan')):9.3f} {t['v2']:9.3f} {t['v2_speedup_vs_native']:9.2f} "
              f"{t['v2_tflops']:8.0f}")

    print(f"\n{'X X^T':14s} {'matmul':>9s} {'gram v2':>9s} {'speedup':>9s}")
    for rows, cols in GRAM:
        X = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        try:
            ref = X.float() @ X.float().T
            err = ((K5.gram(X).float() - ref).norm() / ref.norm()).item()
            del ref
        except (OSError, AttributeError, RuntimeError) as exc:  # the launcher not reachable
            report["gram_ms"][f"{rows}x{cols}"] = {"skipped": repr(exc)}
            print(f"{rows}x{cols}: skipped ({exc!r})")
            continue
        t = {"matmul": bench(lambda: torch.matmul(X, X.T)), "gram_v2": bench(lambda: K5.gram(X)),
             "rel_err": err}
        t["speedup"] = t["matmul"] / t["gram_v2"]
        ok &= err < 1e-2
        report["gram_ms"][f"{rows}x{cols}"] = t
        print(f"{rows}x{cols:<9d} {t['matmul']:9.3f} {t['gram_v2']:9.3f} {t['speedup']:9.2f}  (rel err {err:.1e})")

    report["all_checks_passed"] = bool(ok)
    report["seconds"] = time.time() - t0
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nchecks {'passed' if ok else 'FAILED'}; {report['seconds']:.0f} s; wrote {out_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/device_newton_schulz5.py OUT.json")
    sys.exit(main(sys.argv[1]))
