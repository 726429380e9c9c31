"""gemm.cu's versions 6 and 7 with one m64n256k16 per k16 slice of a 128x256 tile (the default
since 2026-11-27) or the two m64n128k16 they issued before (a build with
LEVELS_CUDA_NVCC_FLAGS=-DLEVELS_WGMMA_N128=1), on an H100: check the build against float64
(device_gemm7's cases: every epilogue, SwiGLU, tails, strided inputs, the symmetric products and
Newton-Schulz), then time cuBLAS beside versions 6 and 7 (single GEMMs, the MLP forward, X X^T,
Newton-Schulz). Run it once per build, in one device call, and compare the ratios to cuBLAS
(each timed in its own process, cuBLAS with it):

    PYTHONPATH=. python3 scripts/device_gemm_wide.py OUT.json
    LEVELS_CUDA_NVCC_FLAGS=-DLEVELS_WGMMA_N128=1 LEVELS_CUDA_CACHE=/tmp/narrow \\
        PYTHONPATH=. python3 scripts/device_gemm_wide.py OUT-narrow.json

Also saves a few products' bits (OUT.pt) so that the two builds can be compared bit for bit
(`--same-bits OTHER.pt`: a wider instruction need not add in the same order).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import device_gemm7  # noqa: E402


def _bits_cases():
    """Products whose bits the two builds' runs save: K-major, transposed (MN-major) operands
    through the MLP's backward GEMMs, and the SwiGLU pair."""
    from cuda_kernels import mlp, swiglu_mlp

    gen = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(1000, 777, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(3000, 777, device="cuda", generator=gen).to(torch.bfloat16)
    w2 = torch.randn(3000, 777, device="cuda", generator=gen).to(torch.bfloat16)
    dy = torch.randn(1000, 3000, device="cuda", generator=gen).to(torch.bfloat16)
    out = {}
    for v in (6, 7):
        out[f"v{v} plain"] = mlp.gemm(a, w.t(), version=v)
        out[f"v{v} swiglu"] = swiglu_mlp.gate_up(a, w, w2, save=False, version=v)
    # dW = dY^T X: A stored (K, M) with M contiguous, B (K, N) with N contiguous (version 6
    # reads both as they lie)
    out["v6 dW"] = mlp.gemm(dy.t(), a, version=6)
    out["v6 dX"] = mlp.gemm(dy, w, version=6)
    return {k: (v[0] if isinstance(v, tuple) else v).cpu() for k, v in out.items()}


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    flags = os.environ.get("LEVELS_CUDA_NVCC_FLAGS", "")
    from cuda_kernels import build

    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "nvcc_flags": flags,
              "instruction": "2 x m64n128k16" if "LEVELS_WGMMA_N128=1" in flags else "m64n256k16"}
    with device_gemm7.written(out, report, "wide") as t0:
        build.load()
        report["build_s"] = time.perf_counter() - t0
        print(f"[wide] {report['gpu']} ({report['instruction']}): built in {report['build_s']:.0f} s", flush=True)
        failures = []
        for v in (6, 7):
            failures += device_gemm7.run_checks(report.setdefault(f"checks_v{v}", {}), v,
                                                device_gemm7.CHECK_SHAPES, batched=(v == 7))
        report["check_failures"] = failures
        bits = _bits_cases()
        torch.save(bits, out.with_suffix(".pt"))
        if "--same-bits" in sys.argv:
            other = torch.load(sys.argv[sys.argv.index("--same-bits") + 1])
            report["same_bits_as_other_build"] = {k: bool(torch.equal(bits[k], other[k])) for k in bits}
            print(f"[wide] same bits as the other build: {report['same_bits_as_other_build']}", flush=True)
        print("[wide] timings (bf16, do_bench median; ratio = cuBLAS time / version time)", flush=True)
        device_gemm7.run_timings(report, versions=(6, 7), batched=True)

if __name__ == "__main__":
    main()
