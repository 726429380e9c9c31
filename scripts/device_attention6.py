"""attention.cu's version 6 (Hopper wgmma) on an H100, in one call: build Level 5, check
version 6 against float64 (forward, and the backward v4's kernels run on v6's out and lse)
at a few shapes, then time the forward of SDPA's FLASH and cuDNN backends, Level 4 (Triton),
Level 5 version 5 and version 6 at issue #29's shapes.

    PYTHONPATH=. python3 scripts/device_attention6.py OUT.json [--check-only]

Timing: CUDA events around one call, the L2 flushed (a 256 MB write) before each, >= 25 calls
a candidate; median, p20 and p80 in ms, TFLOP/s of the median (4 B H Nq Nk D, half of it
causal) and ratios to FLASH and cuDNN. A failing check or a candidate that raises is recorded
in OUT.json and printed, not fatal (the timings of a version that failed its check are marked).
~1-2 min on an H100 after the build (build_s in OUT.json).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# relative Frobenius error against float64 (inputs in the dtype): the harness's 16-bit scale
BOUND = {torch.bfloat16: 2e-2, torch.float16: 5e-3}
# (B, H, H_kv, Nq, Nk, D, causal, bottom_right, kv_lens)
CHECKS = [(2, 3, 3, 77, 77, 64, False, False, None),
          (1, 4, 4, 1000, 1000, 128, True, False, None),
          (2, 4, 2, 1025, 1025, 64, True, False, None),
          (2, 4, 4, 130, 300, 128, True, True, [300, 171]),
          (2, 16, 4, 600, 600, 128, False, False, None),  # 2 warpgroups a block
          (2, 16, 16, 600, 600, 64, True, False, None)]
# (B, H, N, D, causal): issue #29's table and the short shapes
SHAPES = [(4, 16, 4096, 128, False), (1, 32, 2048, 128, True), (8, 8, 1000, 64, False),
          (8, 12, 1024, 64, True), (64, 12, 197, 64, False), (32, 12, 512, 64, False)]


def rel(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def reference(q, k, v, causal, bottom_right, lens):
    """float64 attention with the kernels' conventions (a row that sees no key: 0)."""
    Nq, Nk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    kd, vd = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = (q.double() @ kd.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(Nq, device=q.device)[:, None]
    j = torch.arange(Nk, device=q.device)[None, :]
    masks = []
    for b in range(q.shape[0]):
        end = Nk if lens is None else lens[b]
        shift = end - Nq if bottom_right else 0
        masks.append((j >= end) | ((j > i + shift) if causal else torch.zeros_like(j, dtype=torch.bool)))
    s = s.masked_fill(torch.stack(masks)[:, None], float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1)) @ vd


def run_checks(report):
    import cuda_kernels.attention as K5

    errs, failures = {}, []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for B, H, H_kv, Nq, Nk, D, causal, br, lens in CHECKS:
            tag = f"{str(dtype)[6:]} B{B} H{H}/{H_kv} Nq{Nq} Nk{Nk} D{D}{' causal' if causal else ''}" \
                  f"{' bottom-right' if br else ''}{' kv_lens' if lens else ''}"
            try:
                q = torch.randn(B, H, Nq, D, device="cuda", generator=gen).to(dtype).requires_grad_()
                k = torch.randn(B, H_kv, Nk, D, device="cuda", generator=gen).to(dtype).requires_grad_()
                v = torch.randn(B, H_kv, Nk, D, device="cuda", generator=gen).to(dtype).requires_grad_()
                kv = None if lens is None else torch.tensor(lens, device="cuda", dtype=torch.int32)
                out = K5.attention(q, k, v, causal, None, version=6, bottom_right=br, kv_lens=kv)
                dout = torch.randn_like(out)
                out.backward(dout)
                leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
                ref = reference(*leaves, causal, br, lens)
                ref.backward(dout.double())
                for name, got, want in [("out", out, ref)] + [
                        (f"grad {n}", x.grad, y.grad) for n, x, y in zip("qkv", (q, k, v), leaves)]:
                    err = rel(got, want.detach())
                    ok = bool(torch.isfinite(got).all()) and err <= BOUND[dtype]
                    errs[f"{tag} {name}"] = err
                    print(f"  {'ok  ' if ok else 'FAIL'} {tag} {name}: rel err {err:.2e} (bound {BOUND[dtype]:.0e})")
                    if not ok:
                        failures.append(f"{tag} {name}: {err:.3e}")
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                print(f"  FAIL {tag}: {type(e).__name__}: {e}")
                failures.append(f"{tag}: {type(e).__name__}: {str(e)[:300]}")
    report["check_errors"] = errs
    report["check_failures"] = failures


def time_ms(fn, n=25, min_s=0.25):
    """CUDA events around single calls, the L2 flushed before each: (median, p20, p80) ms."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    samples = []
    t_end = time.perf_counter() + min_s
    while len(samples) < n or (time.perf_counter() < t_end and len(samples) < 200):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    s = torch.tensor(samples, dtype=torch.float64)
    return float(s.median()), float(s.quantile(0.2)), float(s.quantile(0.8))


def run_timings(report):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cuda_kernels.attention as K5
    import levels

    l4 = levels.get("triton")
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for B, H, N, D, causal in SHAPES:
        q, k, v = (torch.randn(B, H, N, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * N * N * D // (2 if causal else 1)
        calls = {}
        for name, backend in (("FLASH", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            calls[name] = sdpa
        calls["level4"] = lambda: l4.attention(q, k, v, causal)
        calls["level5 v5"] = lambda: K5.attention(q, k, v, causal, None, version=5)
        calls["level5 v6"] = lambda: K5.attention(q, k, v, causal, None, version=6)
        row = {"B": B, "H": H, "N": N, "D": D, "causal": causal, "dtype": "bfloat16", "flops": flops, "ms": {}}
        for name, fn in calls.items():
            try:
                with torch.no_grad():
                    med, p20, p80 = time_ms(fn)
                row["ms"][name] = {"median": med, "p20": p20, "p80": p80, "tflops": flops / med / 1e9}
            except Exception as e:  # noqa: BLE001 - a backend that does not take this shape: said
                row["ms"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        for ref in ("FLASH", "cuDNN"):
            base = row["ms"].get(ref, {}).get("median")
            for name, t in row["ms"].items():
                if base and "median" in t:
                    t[f"vs_{ref}"] = base / t["median"]
        rows.append(row)
        print(f"B{B} H{H} N{N} D{D} {'causal' if causal else 'full'}:", flush=True)
        for name, t in row["ms"].items():
            print(timing_line(f"{name:10s}", t))
        del q, k, v
    report["timings"] = rows


def timing_line(label, t):
    """One candidate's row: median [p20, p80] in us, TFLOP/s, ratios to FLASH and cuDNN."""
    if "median" not in t:
        return f"  {label} {t['error']}"
    return (f"  {label} {t['median'] * 1e3:9.1f} us [{t['p20'] * 1e3:.1f}, {t['p80'] * 1e3:.1f}] "
            f"{t['tflops']:6.0f} TFLOP/s  {t.get('vs_FLASH', 0):.2f}x FLASH  "
            f"{t.get('vs_cuDNN', 0):.2f}x cuDNN")


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    check_only = "--check-only" in sys.argv[2:]
    import cuda_kernels.attention as K5
    from cuda_kernels import versions

    report = {"what": "attention.cu version 6 (wgmma): checks vs float64, forward timings (bf16)",
              "command": "PYTHONPATH=. python3 scripts/device_attention6.py OUT.json" + (" --check-only" if check_only else ""),
              "gpu": torch.cuda.get_device_name(), "sm90": versions.on_hopper(), "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": K5.VERSIONS, "default_version": K5.DEFAULT_VERSION,
              "timing": "CUDA events, L2 flushed before each call, >= 25 calls: median [p20, p80] ms"}
    run_and_write(report, out, "attention6", 6, run_checks, run_timings, check_only,
                  "forward timings (bf16)")


def run_and_write(report, out, tag, version, checks, timings, check_only, what):
    """Builds Level 5, runs `checks` then (unless check_only) `timings` on `report`, and writes
    it to `out` even when one raises; a version that failed a check has its timings marked."""
    from cuda_kernels import build

    t0 = time.perf_counter()
    build.load()
    report["build_s"] = time.perf_counter() - t0
    print(f"[{tag}] {report['gpu']}: built in {report['build_s']:.0f} s; checks", flush=True)
    try:
        checks(report)
        if not check_only:
            print(f"[{tag}] {what}", flush=True)
            timings(report)
            if report["check_failures"]:
                report["note"] = f"version {version} FAILED checks: its timings are of a wrong kernel"
    finally:
        report["total_s"] = time.perf_counter() - t0
        out.write_text(json.dumps(report, indent=1, default=str))
    print(f"[{tag}] wrote {out} ({report['total_s']:.0f} s); "
          f"{len(report.get('check_failures', []))} check failure(s)")
    if report.get("check_failures"):
        print("  " + "\n  ".join(report["check_failures"]))

if __name__ == "__main__":
    main()
