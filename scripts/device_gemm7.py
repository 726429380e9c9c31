"""gemm.cu's version 7 (persistent, warp-specialized, epilogue under the next tile's loads) on
an H100, in one call: build Level 5, check version 7 against float64 (every epilogue, the
SwiGLU pair, odd M/N/K tails, strided inputs, many tiles per block, fewer tiles than SMs, the
batched / symmetric products through Newton–Schulz version 4 and its gram) and against version
6's bits, then time cuBLAS beside versions 5, 6 and 7.

    PYTHONPATH=. python3 scripts/device_gemm7.py OUT.json [--check-only]

Robust by design: each check and each timing is its own case; a failure (a wrong answer or an
exception) is recorded in OUT.json and the run goes on. A CUDA fault poisons the context, so
the cases after it fail too: read the FIRST failure. OUT.json is written even when the run
stops early. Timings are triton's do_bench (median, p20, p80 in ms, bf16). ~1-2 min on an
H100 after the build (build_s is recorded apart).
A hang (a wrong mbarrier parity): run under `timeout`, and rebuild with
LEVELS_CUDA_NVCC_FLAGS=-DLEVELS_GEMM7_TIMEOUT=200 (every mbarrier wait traps after 200 million
polls) to get an error naming the block and thread instead.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# relative Frobenius error bound against float64 (inputs rounded to the dtype first)
BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
# (M, N, K): tails everywhere; (4096, 4096, 328): 512 tiles of 128x256, ~4 per block, K not a
# multiple of the ring; (300, 264, 520): 9 tiles of 128x128, far fewer than the SMs
CHECK_SHAPES = [(1, 7, 70), (7, 129, 64), (127, 129, 1000), (129, 1000, 70), (300, 264, 520),
                (1000, 1000, 1000), (2048, 512, 4096), (3000, 2100, 136), (4096, 4096, 328)]
V = 7  # the version under test
COEFFS = (3.4445, -4.7750, 2.0315)


def rel(out, ref) -> float:
    out = out.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


class Checks:
    """Each check records its error and verdict; an exception inside a case is a failure of
    that case, not of the run."""

    def __init__(self):
        self.errors, self.failures = {}, []

    def close(self, name, out, ref, dtype, bound=None):
        bound = BOUND[dtype] if bound is None else bound
        err = rel(out, ref)
        ok = bool(torch.isfinite(out).all()) and err <= bound
        self.errors[name] = err
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: rel err {err:.2e} (bound {bound:.0e})", flush=True)
        if not ok:
            self.failures.append(f"{name}: rel err {err:.3e} > {bound:.0e} (or not finite)")

    def same_bits(self, name, got, want):
        ok = torch.equal(got, want)
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: {'bitwise equal' if ok else 'bits differ'}", flush=True)
        if not ok:
            self.failures.append(f"{name}: bits differ (max |diff| "
                                 f"{float((got.double() - want.double()).abs().max()):.3e})")

    def case(self, name, fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            print(f"  FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            self.failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            self.errors[name + " traceback"] = traceback.format_exc()[-1500:]


def _ns(G, version, steps=5):
    from cuda_kernels import newton_schulz
    return newton_schulz.newton_schulz(G, steps, *COEFFS, 1e-7, version=version)


def run_checks(report, V=V, shapes=CHECK_SHAPES, batched=True):
    """V against float64 and version 6's bits on `shapes`; batched: also the gram and
    Newton–Schulz version 4 (GEMM version 7's batched kernel)."""
    from cuda_kernels import mlp, newton_schulz, swiglu_mlp
    import levels

    ck = Checks()
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, dtype):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    def poison():  # freed NaN: outputs allocated next land in it, so an unwritten element shows
        torch.full((64 << 20,), float("nan"), device="cuda")

    for dtype in (torch.bfloat16, torch.float16):
        for (M, N, K) in shapes:
            tag = f"{str(dtype)[6:]} {M}x{N}x{K}"

            def gemm_case(M=M, N=N, K=K, tag=tag):
                a, w = rnd(M, K, dtype=dtype), rnd(N, K, dtype=dtype) / K ** 0.5
                bias = rnd(N, dtype=dtype)
                prod = a.double() @ w.double().t()
                poison()
                out = mlp.gemm(a, w.t(), version=V)
                ck.close(tag + " none", out, prod, dtype)
                ck.same_bits(tag + " none = v6", out, mlp.gemm(a, w.t(), version=6))
                poison()
                out = mlp.gemm(a, w.t(), bias, "gelu", version=V)
                ck.close(tag + " bias+gelu", out, F.gelu(prod + bias.double()), dtype)
                ck.same_bits(tag + " bias+gelu = v6", out, mlp.gemm(a, w.t(), bias, "gelu", version=6))
                poison()
                act, pre = mlp.gemm(a, w.t(), bias, "gelu_save", version=V)
                ck.close(tag + " gelu_save act", act, F.gelu(prod + bias.double()), dtype)
                ck.close(tag + " gelu_save pre", pre, prod + bias.double(), dtype)
                aux = rnd(M, N, dtype=dtype)
                x = aux.double()
                dgelu = 0.5 * (1 + torch.erf(x / 2 ** 0.5)) + x * torch.exp(-0.5 * x * x) / (2 * torch.pi) ** 0.5
                poison()
                ck.close(tag + " gelu_grad", mlp.gemm(a, w.t(), epilogue="gelu_grad", aux=aux, version=V),
                         prod * dgelu, dtype)
                poison()
                ck.close(tag + " fp32 out", mlp.gemm(a, w.t(), out_dtype=torch.float32, version=V), prod, dtype)
                c = rnd(M, N, dtype=torch.float32)
                ref = c.double() + prod + bias.double()
                ck.close(tag + " accumulate", mlp.gemm_accumulate(c, a, w.t(), bias, version=V), ref, dtype)
                # strided operands: a transposed view, b a row-major (K, N) (the op makes them K-major)
                ck.close(tag + " strided", mlp.gemm(a.t().contiguous().t(), w.t().contiguous(), version=V),
                         prod, dtype)
                # the SwiGLU gate/up GEMM (N = hidden) and its gradient epilogue
                w2 = rnd(N, K, dtype=dtype) / K ** 0.5
                poison()
                act, g, u = swiglu_mlp.gate_up(a, w, w2, save=True, version=V)
                u_ref = a.double() @ w2.double().t()
                ck.close(tag + " swiglu act", act, F.silu(prod) * u_ref, dtype)
                ck.close(tag + " swiglu g", g, prod, dtype)
                ck.close(tag + " swiglu u", u, u_ref, dtype)
                want = swiglu_mlp.gate_up(a, w, w2, save=True, version=6)
                ck.same_bits(tag + " swiglu act = v6", act, want[0])

            ck.case(tag, gemm_case)

        if not batched:
            continue
        # the batched / symmetric launcher: X X^T through newton_schulz.gram at NS version 4
        for rows, cols in ((1, 8), (130, 72), (300, 1000), (1024, 2048), (4096, 136)):
            tag = f"{str(dtype)[6:]} gram v4 {rows}x{cols}"

            def gram_case(rows=rows, cols=cols, tag=tag):
                X = rnd(rows, cols, dtype=dtype)
                poison()
                A = newton_schulz.gram(X, version=4)
                ck.close(tag, A, X.double() @ X.double().t(), dtype)
                ck.same_bits(tag + " = gram v3", A, newton_schulz.gram(X, version=3))

            ck.case(tag, gram_case)
        # Newton–Schulz version 4 (every product on GEMM v7, batched and symmetric): against
        # float64 math, within twice version 3's error (five steps of rounding to the dtype)
        native = levels.get("native")
        for shape in ((64, 100), (300, 520), (520, 300), (1024, 2048), (3, 257, 513), (4, 768, 2304)):
            tag = f"{str(dtype)[6:]} NS v4 {'x'.join(map(str, shape))}"

            def ns_case(shape=shape, tag=tag):
                G = rnd(*shape, dtype=dtype)
                ref = native.newton_schulz_math(G.double(), 5, *COEFFS, 1e-7)
                poison()
                out4 = _ns(G, 4)
                out3 = _ns(G, 3)
                ck.close(tag, out4, ref, dtype, bound=2 * rel(out3, ref) + 1e-3)
                report.setdefault("ns_bits_equal_v3", {})[tag] = bool(torch.equal(out4, out3))

            ck.case(tag, ns_case)
    report["check_errors"] = ck.errors
    report["check_failures"] = ck.failures
    print(f"[gemm{V}] checks: {len(ck.failures)} failure(s)", flush=True)
    return ck.failures


def bench(fn) -> dict:
    """do_bench's p20, median, p80 (ms); an exception is recorded as the row's error."""
    import triton.testing
    p20, p50, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.2, 0.5, 0.8])
    return {"ms": float(p50), "p20_ms": float(p20), "p80_ms": float(p80)}


def _time_row(row, fns, flops, baseline):
    """Time each of fns (name -> callable) into row; ratios = baseline time / version time
    (above 1: faster than cuBLAS)."""
    for name, fn in fns.items():
        try:
            t = bench(fn)
            row[name] = {**t, "tflops": flops / t["ms"] / 1e9}
        except Exception as exc:  # noqa: BLE001 - one failing case is recorded, not fatal
            row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    base = row.get(baseline, {}).get("ms")
    for name in fns:
        if name != baseline and base and "ms" in row[name]:
            row[name + "_vs_" + baseline] = base / row[name]["ms"]
    parts = [f"{n} {row[n]['tflops']:5.0f}" if "ms" in row[n] else f"{n} ERROR" for n in fns]
    ratios = [f"{n}={row[n + '_vs_' + baseline]:.2f}x" for n in fns if n + "_vs_" + baseline in row]
    print(f"  {row['name']:42s} " + "  ".join(parts) + " TFLOP/s  " + " ".join(ratios), flush=True)


def run_timings(report, versions=(5, 6, 7), batched=True):
    """cuBLAS beside each of `versions`: single GEMMs and the MLP forward; batched: also the
    symmetric X X^T and Newton–Schulz (whose versions map to GEMM versions 5-7)."""
    from cuda_kernels import mlp, newton_schulz
    import levels

    gen = torch.Generator(device="cuda").manual_seed(1)
    dt = torch.bfloat16

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dt)

    # one GEMM: "none" against torch.matmul, "gelu" (bias + GELU, the MLP's first GEMM) against
    # F.gelu(F.linear(+bias)); (name, M, N, K, epilogues)
    gemms = [("8192^3", 8192, 8192, 8192, ("none",)), ("4096^3", 4096, 4096, 4096, ("none",)),
             ("MLP M8192 4096->16384", 8192, 16384, 4096, ("gelu", "none")),
             ("M4096 1024->4096", 4096, 4096, 1024, ("gelu", "none")),
             ("M128 4096->11008", 128, 11008, 4096, ("gelu", "none")),
             ("M1000 768->3072", 1000, 3072, 768, ("gelu", "none")),
             ("M4096 4096->11008", 4096, 11008, 4096, ("gelu", "none"))]
    rows = []
    for name, M, N, K, epis in gemms:
        try:
            a, w, bias = rnd(M, K), rnd(N, K, scale=K ** -0.5), rnd(N)
        except Exception as exc:  # noqa: BLE001
            rows.append({"name": name, "error": repr(exc)})
            continue
        for epi in epis:
            row = {"name": f"{name} {'+bias+gelu' if epi == 'gelu' else 'plain'}", "M": M, "N": N, "K": K,
                   "epilogue": epi}
            if epi == "gelu":
                fns = {"cublas": lambda: F.gelu(F.linear(a, w, bias))}
                fns.update({f"v{v}": (lambda v=v: mlp.gemm(a, w.t(), bias, "gelu", version=v)) for v in versions})
            else:
                fns = {"cublas": lambda: torch.matmul(a, w.t())}
                fns.update({f"v{v}": (lambda v=v: mlp.gemm(a, w.t(), version=v)) for v in versions})
            _time_row(row, fns, 2 * M * N * K, "cublas")
            rows.append(row)
    report["gemm"] = rows

    # the whole MLP forward (#28's goal): linear -> GELU -> linear, (M, K, hidden)
    mlps = []
    with torch.no_grad():
        for M, K, H in ((8192, 4096, 16384), (4096, 1024, 4096), (128, 4096, 11008), (1000, 768, 3072),
                        (4096, 4096, 11008)):
            try:
                x, w1, b1 = rnd(M, K), rnd(H, K, scale=K ** -0.5), rnd(H)
                w2, b2 = rnd(K, H, scale=H ** -0.5), rnd(K)
            except Exception as exc:  # noqa: BLE001
                mlps.append({"name": f"MLP fwd M{M} {K}->{H}->{K}", "error": repr(exc)})
                continue
            row = {"name": f"MLP fwd M{M} {K}->{H}->{K}", "M": M, "K": K, "hidden": H}
            fns = {"cublas": lambda: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)}
            fns.update({f"v{v}": (lambda v=v: mlp.mlp_forward(x, w1, b1, w2, b2, version=v)) for v in versions})
            _time_row(row, fns, 4 * M * K * H, "cublas")
            mlps.append(row)
    report["mlp_forward"] = mlps
    if not batched:
        return

    # the batched symmetric product X X^T (Newton–Schulz's gram; NS versions 2, 3, 4 = GEMM
    # versions 5, 6, 7) against torch.matmul(X, X.T); TFLOP/s of the full product
    syms = []
    for n in (4096, 8192):
        try:
            X = rnd(n, n)
        except Exception as exc:  # noqa: BLE001
            syms.append({"name": f"X X^T {n}x{n}", "error": repr(exc)})
            continue
        row = {"name": f"X X^T {n}x{n}", "n": n}
        fns = {"torch": lambda: torch.matmul(X, X.T)}
        fns.update({f"v{g}": (lambda ns=ns: newton_schulz.gram(X, version=ns))
                    for ns, g in newton_schulz.GEMM_VERSION.items()})
        _time_row(row, fns, 2 * n * n * n, "torch")
        syms.append(row)
    report["symmetric"] = syms

    # Newton–Schulz (5 steps) on each GEMM against native (cuBLAS)
    ns_rows = []
    native = levels.get("native")
    for shape in ((4096, 4096), (4096, 11008)):
        G = rnd(*shape)
        row = {"name": f"NS {shape[0]}x{shape[1]}", "shape": list(shape)}
        fns = {"native": lambda: native.newton_schulz(G)}
        fns.update({f"ns_v{ns}": (lambda ns=ns: _ns(G, ns)) for ns in newton_schulz.GEMM_VERSION})
        m, n = shape
        _time_row(row, fns, 5 * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n), "native")
        ns_rows.append(row)
    report["newton_schulz"] = ns_rows


@contextlib.contextmanager
def written(out: Path, report: dict, tag: str):
    """Runs the body; whatever happens in it (a failure, a fault, Ctrl-C), `report` is written
    to `out` with the body's seconds, and a fatal error is recorded in it before it goes on."""
    t0 = time.perf_counter()
    try:
        yield t0
    except BaseException as exc:
        report["fatal"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
        raise
    finally:
        report["total_s"] = time.perf_counter() - t0
        out.write_text(json.dumps(report, indent=1, default=str))
        print(f"[{tag}] wrote {out} ({report['total_s']:.0f} s)", flush=True)


def main(V=V, versions=(5, 6, 7), batched=True, shapes=None, doc=__doc__):
    """The run; scripts/device_gemm8.py calls it for version 8 (no batched kernel of its own).
    shapes: None (CHECK_SHAPES) or a function of the GPU's SM count giving the (M, N, K) list."""
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit(doc)
    out = Path(sys.argv[1])
    check_only = "--check-only" in sys.argv[2:]
    from cuda_kernels import build, mlp, newton_schulz

    report = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
              "sms": torch.cuda.get_device_properties(0).multi_processor_count, "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "version_under_test": V, "mlp_versions": mlp.VERSIONS,
              "newton_schulz_versions": newton_schulz.VERSIONS, "check_only": check_only}
    with written(out, report, f"gemm{V}") as t0:
        build.load()
        report["build_s"] = time.perf_counter() - t0
        print(f"[gemm{V}] {report['gpu']}: built in {report['build_s']:.0f} s; checks", flush=True)
        t1 = time.perf_counter()
        check_shapes = CHECK_SHAPES if shapes is None else shapes(report["sms"])
        report["check_shapes"] = check_shapes
        failures = run_checks(report, V, check_shapes, batched)
        report["checks_s"] = time.perf_counter() - t1
        if not check_only:
            if failures:
                print(f"[gemm{V}] version {V} FAILED checks: timings follow but are of a wrong kernel", flush=True)
            print(f"[gemm{V}] timings (bf16, triton do_bench median; ratios: baseline time / version time)",
                  flush=True)
            t2 = time.perf_counter()
            run_timings(report, versions, batched)
            report["timings_s"] = time.perf_counter() - t2
    if report.get("check_failures"):
        raise SystemExit(f"version {V} failed {len(report['check_failures'])} check(s): see {out}")


if __name__ == "__main__":
    main()
