"""gemm.cu's version 6 (TMA + producer/consumer warpgroups) on an H100, in one call: build
Level 5, check version 6 against float64 at a few shapes and every epilogue (raises on the
first failure: no timing of a wrong kernel), then time cuBLAS (torch, eager, the same
epilogue), version 5 and version 6, and Newton–Schulz on GEMM version 6 (its version 3)
against version 2 (GEMM version 5) and native (cuBLAS).

    PYTHONPATH=. python3 scripts/device_gemm6.py OUT.json [--check-only]

Prints a table; writes OUT.json (GPU name, versions, every figure). ~1-2 min on an H100.
A hang: rebuild with LEVELS_CUDA_NVCC_FLAGS=-DLEVELS_GEMM6_TIMEOUT=200 (every mbarrier wait
traps after 200 million polls) to get an error instead.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# relative Frobenius error bound against float64 (inputs rounded to the dtype first)
BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
CHECK_SHAPES = [(1, 7, 70), (7, 129, 64), (127, 129, 1000), (129, 1000, 70), (300, 520, 264),
                (1000, 1000, 1000), (2048, 4096, 512)]


def rel(out, ref) -> float:
    out = out.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def check(name, out, ref, dtype, failures):
    err = rel(out, ref)
    ok = bool(torch.isfinite(out).all()) and err <= BOUND[dtype]
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: rel err {err:.2e} (bound {BOUND[dtype]:.0e})")
    if not ok:
        failures.append(f"{name}: {err:.3e}")
    return err


def run_checks(report):
    from cuda_kernels import mlp, newton_schulz, swiglu_mlp
    import levels

    failures, errs = [], {}
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, dtype):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    for dtype in (torch.bfloat16, torch.float16):
        for (M, N, K) in CHECK_SHAPES:
            a, w = rnd(M, K, dtype=dtype), rnd(N, K, dtype=dtype) / K ** 0.5
            bias = rnd(N, dtype=dtype)
            prod = a.double() @ w.double().t()
            tag = f"{str(dtype)[6:]} {M}x{N}x{K}"
            errs[tag + " none"] = check(tag + " none", mlp.gemm(a, w.t(), version=6), prod, dtype, failures)
            errs[tag + " bias+gelu"] = check(tag + " bias+gelu", mlp.gemm(a, w.t(), bias, "gelu", version=6),
                                             F.gelu(prod + bias.double()), dtype, failures)
            act, pre = mlp.gemm(a, w.t(), bias, "gelu_save", version=6)
            check(tag + " gelu_save act", act, F.gelu(prod + bias.double()), dtype, failures)
            check(tag + " gelu_save pre", pre, prod + bias.double(), dtype, failures)
            aux = rnd(M, N, dtype=dtype)
            x = aux.double()
            dgelu = 0.5 * (1 + torch.erf(x / 2 ** 0.5)) + x * torch.exp(-0.5 * x * x) / (2 * torch.pi) ** 0.5
            check(tag + " gelu_grad", mlp.gemm(a, w.t(), epilogue="gelu_grad", aux=aux, version=6),
                  prod * dgelu, dtype, failures)
            check(tag + " fp32 out", mlp.gemm(a, w.t(), out_dtype=torch.float32, version=6), prod, dtype, failures)
            c = rnd(M, N, dtype=torch.float32)
            ref = c.double() + prod + bias.double()
            check(tag + " accumulate", mlp.gemm_accumulate(c, a, w.t(), bias, version=6), ref, dtype, failures)
            # the SwiGLU gate/up GEMM (N = hidden)
            w2 = rnd(N, K, dtype=dtype) / K ** 0.5
            act, g, u = swiglu_mlp.gate_up(a, w, w2, save=True, version=6)
            g_ref, u_ref = prod, a.double() @ w2.double().t()
            check(tag + " swiglu act", act, F.silu(g_ref) * u_ref, dtype, failures)
            check(tag + " swiglu g", g, g_ref, dtype, failures)
        # the batched / symmetric launcher: X X^T through newton_schulz.gram at NS version 3
        for rows, cols in ((1, 8), (130, 72), (300, 1000), (1024, 2048)):
            X = rnd(rows, cols, dtype=dtype)
            tag = f"{str(dtype)[6:]} gram {rows}x{cols}"
            check(tag, newton_schulz.gram(X, version=3), X.double() @ X.double().t(), dtype, failures)
        # Newton–Schulz version 3 (GEMM v6): against float64 math, within twice version 2's
        # (GEMM v5) error, five steps of rounding to the dtype being what they are
        native = levels.get("native")
        for shape in ((64, 100), (300, 520), (520, 300), (1024, 2048)):
            G = rnd(*shape, dtype=dtype)
            ref = native.newton_schulz_math(G.double(), 5, 3.4445, -4.7750, 2.0315, 1e-7)
            tag = f"{str(dtype)[6:]} NS v3 {shape[0]}x{shape[1]}"
            e2, e3 = rel(_ns(G, 2), ref), rel(out3 := _ns(G, 3), ref)
            ok = bool(torch.isfinite(out3).all()) and e3 <= 2 * e2 + 1e-3
            print(f"  {'ok  ' if ok else 'FAIL'} {tag}: rel err {e3:.2e} (version 2: {e2:.2e})")
            errs[tag] = e3
            if not ok:
                failures.append(f"{tag}: {e3:.3e} vs version 2's {e2:.3e}")
    report["check_errors"] = errs
    report["check_failures"] = failures
    if failures:
        raise SystemExit("version 6 FAILED its checks:\n  " + "\n  ".join(failures))


def _ns(G, version, steps=5):
    from cuda_kernels import newton_schulz
    a, b, c = 3.4445, -4.7750, 2.0315
    return newton_schulz.newton_schulz(G, steps, a, b, c, 1e-7, version=version)


def bench(fn) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def run_timings(report):
    from cuda_kernels import mlp
    import levels

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    dt = torch.bfloat16
    shapes = [("8192^3", 8192, 8192, 8192, "none"), ("4096^3", 4096, 4096, 4096, "none"),
              ("MLP up M8192 4096->16384 +bias+gelu", 8192, 16384, 4096, "gelu"),
              ("M4096 1024->4096", 4096, 4096, 1024, "none"), ("M128 4096->11008", 128, 11008, 4096, "none")]
    for name, M, N, K, epi in shapes:
        a = torch.randn(M, K, device="cuda", generator=gen).to(dt)
        w = (torch.randn(N, K, device="cuda", generator=gen) / K ** 0.5).to(dt)
        bias = torch.randn(N, device="cuda", generator=gen).to(dt) if epi == "gelu" else None
        if epi == "gelu":
            cublas = lambda: F.gelu(F.linear(a, w, bias))  # noqa: E731
        else:
            cublas = lambda: F.linear(a, w)  # noqa: E731
        t = {"cublas": bench(cublas)}
        for v in (5, 6):
            t[f"v{v}"] = bench(lambda v=v: mlp.gemm(a, w.t(), bias, epi, version=v))
        flops = 2 * M * N * K
        row = {"name": name, "M": M, "N": N, "K": K, "epilogue": epi, **{k + "_ms": x for k, x in t.items()},
               **{k + "_tflops": flops / x / 1e9 for k, x in t.items()},
               "v5_vs_cublas": t["cublas"] / t["v5"], "v6_vs_cublas": t["cublas"] / t["v6"]}
        rows.append(row)
        print(f"  {name:38s} cuBLAS {row['cublas_tflops']:6.0f}  v5 {row['v5_tflops']:6.0f} "
              f"({row['v5_vs_cublas']:.2f}x)  v6 {row['v6_tflops']:6.0f} ({row['v6_vs_cublas']:.2f}x) TFLOP/s")
        del a, w
    report["gemm"] = rows
    ns_rows = []
    native = levels.get("native")
    for shape in ((4096, 4096), (4096, 11008)):
        G = torch.randn(*shape, device="cuda", generator=gen).to(dt)
        t = {"native": bench(lambda: native.newton_schulz(G)), "ns_v2": bench(lambda: _ns(G, 2)),
             "ns_v3": bench(lambda: _ns(G, 3))}
        row = {"shape": list(shape), **{k + "_ms": x for k, x in t.items()},
               "v2_vs_native": t["native"] / t["ns_v2"], "v3_vs_native": t["native"] / t["ns_v3"]}
        ns_rows.append(row)
        print(f"  NS {shape[0]}x{shape[1]:<6d} native {t['native']:.3f} ms  v2 (GEMM v5) {t['ns_v2']:.3f} ms "
              f"({row['v2_vs_native']:.2f}x)  v3 (GEMM v6) {t['ns_v3']:.3f} ms ({row['v3_vs_native']:.2f}x)")
    report["newton_schulz"] = ns_rows


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    check_only = "--check-only" in sys.argv[2:]
    from cuda_kernels import build, mlp, newton_schulz

    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "mlp_versions": mlp.VERSIONS, "newton_schulz_versions": newton_schulz.VERSIONS}
    t0 = time.perf_counter()
    build.load()
    report["build_s"] = time.perf_counter() - t0
    print(f"[gemm6] {report['gpu']}: built in {report['build_s']:.0f} s; checks")
    try:
        run_checks(report)
        if not check_only:
            print("[gemm6] timings (bf16, triton do_bench median)")
            run_timings(report)
    finally:
        report["total_s"] = time.perf_counter() - t0
        out.write_text(json.dumps(report, indent=1, default=str))
    print(f"[gemm6] wrote {out} ({report['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
