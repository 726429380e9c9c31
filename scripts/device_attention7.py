"""attention.cu's version 7 (the fused backward: dK, dV and dQ in one kernel per key block, dQ
added into an fp32 workspace with atomics) on an H100, in one call: build Level 5, check
version 7's gradients against float64 at every head size it takes (16-128; causal, both
diagonals, kv_lens, grouped heads, odd lengths, fp16 and bf16) and with RoPE against version
5's backward (the deterministic one, already checked against float64 by the tests), then time
forward+backward and the backward alone of SDPA's FLASH and cuDNN backends, Level 4 (Triton),
Level 5 "old" (the default version: 6 at D 128 on sm_90, else 5; backward v4's two kernels)
and Level 5 version 7, bf16, at issue #29's shapes.

    PYTHONPATH=. python3 scripts/device_attention7.py OUT.json [--check-only]

Timing: triton's do_bench (warmup 25 ms, rep 100 ms, the L2 flushed before each call): median,
p20 and p80 in ms; TFLOP/s of the median with FlashAttention's count (forward 4 B H N^2 D,
backward 2.5x that, half of both when causal); ratios to FLASH and cuDNN. "bwd" times
torch.autograd.grad on a graph kept from one forward (retain_graph), "fwd+bwd" both.
A failing check or a candidate that raises is recorded in OUT.json and printed, not fatal
(the timings of a version that failed its check are marked). ~1-2 min on an H100 after the
build (build_s in OUT.json). The fused kernel's ncu counters (beside v4's two kernels, as in
reports/h100-level5-ncu-attention.json): PYTHONPATH=. python3 scripts/device_level5.py --out DIR
--skip ptxas,harness,opcheck,pytest_gpu,bench --ncu "attention bwd v7,attention bwd v4,attention bwd dq v4".
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.device_attention6 import (  # noqa: E402
    BOUND, reference, rel, run_and_write, timing_line)

V = 7
# (B, H, H_kv, Nq, Nk, D, causal, bottom_right, kv_lens): every head size, a length of no
# tile's multiple, both diagonals, per-batch lengths (one 0), grouped and multi-query heads,
# decoding, and shapes with 8-warp blocks and many key blocks adding into each dQ row
CHECKS = [(2, 3, 3, 77, 77, 16, False, False, None),
          (2, 4, 2, 333, 333, 32, True, False, None),
          (2, 4, 1, 1025, 1025, 64, True, False, None),
          (2, 4, 4, 130, 300, 128, True, True, [300, 171]),
          (2, 4, 4, 257, 129, 64, True, True, [129, 0]),
          (1, 4, 4, 1, 700, 128, True, True, None),
          (2, 16, 4, 600, 600, 128, False, False, None),
          (2, 16, 16, 1100, 1100, 64, True, False, None),
          (1, 8, 8, 2048, 2048, 128, True, False, None)]
# (B, H, N, D, causal): issue #29's table (D 128) and the D 64 sequences of 1024
SHAPES = [(4, 16, 4096, 128, False), (1, 32, 2048, 128, True), (8, 8, 1024, 64, False),
          (8, 12, 1024, 64, True)]
QUANTILES = [0.5, 0.2, 0.8]


def _inputs(B, H, H_kv, Nq, Nk, D, dtype, gen):
    q = torch.randn(B, H, Nq, D, device="cuda", generator=gen).to(dtype).requires_grad_()
    k = torch.randn(B, H_kv, Nk, D, device="cuda", generator=gen).to(dtype).requires_grad_()
    v = torch.randn(B, H_kv, Nk, D, device="cuda", generator=gen).to(dtype).requires_grad_()
    return q, k, v


def _record(report, tag, name, got, want, bound):
    err = rel(got, want)
    ok = bool(torch.isfinite(got).all()) and err <= bound
    report["check_errors"][f"{tag} {name}"] = err
    print(f"  {'ok  ' if ok else 'FAIL'} {tag} {name}: rel err {err:.2e} (bound {bound:.0e})", flush=True)
    if not ok:
        report["check_failures"].append(f"{tag} {name}: {err:.3e}")


def run_checks(report):
    import cuda_kernels.attention as K5

    report["check_errors"], report["check_failures"], report["dq_repeat"] = {}, [], {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for B, H, H_kv, Nq, Nk, D, causal, br, lens in CHECKS:
            tag = f"{str(dtype)[6:]} B{B} H{H}/{H_kv} Nq{Nq} Nk{Nk} D{D}{' causal' if causal else ''}" \
                  f"{' bottom-right' if br else ''}{' kv_lens' if lens else ''}"
            try:
                q, k, v = _inputs(B, H, H_kv, Nq, Nk, D, dtype, gen)
                kv = None if lens is None else torch.tensor(lens, device="cuda", dtype=torch.int32)
                out = K5.attention(q, k, v, causal, None, version=V, bottom_right=br, kv_lens=kv)
                dout = torch.randn_like(out)
                grads = torch.autograd.grad(out, (q, k, v), dout)
                again = torch.autograd.grad(K5.attention(q, k, v, causal, None, version=V, bottom_right=br,
                                                         kv_lens=kv), (q, k, v), dout)
                # dq's atomics: how far apart two runs are (dk, dv must be equal bit for bit)
                report["dq_repeat"][tag] = float((grads[0].float() - again[0].float()).abs().max())
                if not (torch.equal(grads[1], again[1]) and torch.equal(grads[2], again[2])):
                    report["check_failures"].append(f"{tag}: dk/dv differ between two runs")
                leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
                ref = reference(*leaves, causal, br, lens)
                ref.backward(dout.double())
                _record(report, tag, "out", out, ref.detach(), BOUND[dtype])
                for n, got, leaf in zip("qkv", grads, leaves):
                    _record(report, tag, f"grad {n}", got, leaf.grad, BOUND[dtype])
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                print(f"  FAIL {tag}: {type(e).__name__}: {e}", flush=True)
                report["check_failures"].append(f"{tag}: {type(e).__name__}: {str(e)[:300]}")
    # RoPE (v7's forward is v5's there): the gradients against version 5's backward
    for D, interleaved in ((64, False), (128, True)):
        tag = f"bfloat16 rope D{D}{' interleaved' if interleaved else ''} GQA causal"
        try:
            q, k, v = _inputs(2, 8, 2, 300, 300, D, torch.bfloat16, gen)
            ang = torch.arange(300, device="cuda")[:, None] * 0.01 * torch.arange(1, D // 2 + 1, device="cuda")
            cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
            dout = torch.randn(2, 8, 300, D, device="cuda", generator=gen).to(torch.bfloat16)
            got, want = (torch.autograd.grad(K5.attention(q, k, v, True, None, version=ver, rope_cos=cos, rope_sin=sin,
                                                          rope_interleaved=interleaved), (q, k, v), dout)
                         for ver in (V, 5))
            for n, x, y in zip("qkv", got, want):
                _record(report, tag, f"grad {n} vs v5", x, y.double(), BOUND[torch.bfloat16])
        except Exception as e:  # noqa: BLE001
            print(f"  FAIL {tag}: {type(e).__name__}: {e}", flush=True)
            report["check_failures"].append(f"{tag}: {type(e).__name__}: {str(e)[:300]}")


def _bench(fn):
    import triton

    med, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=QUANTILES)
    return float(med), float(p20), float(p80)


def run_timings(report):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cuda_kernels.attention as K5
    import levels

    l4 = levels.get("triton")
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for B, H, N, D, causal in SHAPES:
        q, k, v = (torch.randn(B, H, N, D, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(B, H, N, D, device="cuda", generator=gen).to(torch.bfloat16)
        fwd = 4 * B * H * N * N * D // (2 if causal else 1)
        old = K5.default_version(q)
        forwards = {}
        for name, backend in (("FLASH", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            forwards[name] = sdpa
        forwards["level4"] = lambda: l4.attention(q, k, v, causal)
        forwards[f"level5 v{old}"] = lambda: K5.attention(q, k, v, causal, None, version=old)
        forwards[f"level5 v{V}"] = lambda: K5.attention(q, k, v, causal, None, version=V)
        row = {"B": B, "H": H, "N": N, "D": D, "causal": causal, "dtype": "bfloat16", "old_version": old,
               "flops": {"fwd+bwd": 3.5 * fwd, "bwd": 2.5 * fwd}, "ms": {"fwd+bwd": {}, "bwd": {}}}
        for name, f in forwards.items():
            for mode in ("fwd+bwd", "bwd"):
                try:
                    if mode == "fwd+bwd":
                        def fn(f=f):
                            return torch.autograd.grad(f(), (q, k, v), dout)
                    else:
                        out = f()

                        def fn(out=out):
                            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    med, p20, p80 = _bench(fn)
                    row["ms"][mode][name] = {"median": med, "p20": p20, "p80": p80,
                                             "tflops": row["flops"][mode] / med / 1e9}
                except Exception as e:  # noqa: BLE001 - a backend that does not take this shape: said
                    row["ms"][mode][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            for mode in ("fwd+bwd", "bwd"):
                for ref in ("FLASH", "cuDNN"):
                    base = row["ms"][mode].get(ref, {}).get("median")
                    for t in row["ms"][mode].values():
                        if base and "median" in t:
                            t[f"vs_{ref}"] = base / t["median"]
        rows.append(row)
        print(f"B{B} H{H} N{N} D{D} {'causal' if causal else 'full'}:", flush=True)
        for mode in ("fwd+bwd", "bwd"):
            for name, t in row["ms"][mode].items():
                print(timing_line(f"{mode:7s} {name:10s}", t), flush=True)
    report["timings"] = rows


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    check_only = "--check-only" in sys.argv[2:]
    import cuda_kernels.attention as K5
    from cuda_kernels import versions

    report = {"what": f"attention.cu version {V} (fused backward, dQ by atomics): checks vs float64, "
                      "fwd+bwd and bwd timings (bf16)",
              "command": f"PYTHONPATH=. python3 scripts/device_attention{V}.py OUT.json"
                         + (" --check-only" if check_only else ""),
              "gpu": torch.cuda.get_device_name(), "sm90": versions.on_hopper(), "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": K5.VERSIONS, "default_version": K5.DEFAULT_VERSION,
              "timing": "triton do_bench (warmup 25 ms, rep 100 ms, L2 flushed): median [p20, p80] ms; "
                        "FLOPs: fwd 4BHN^2D, bwd 2.5x fwd, halved when causal"}
    run_and_write(report, out, f"attention{V}", V, run_checks, run_timings, check_only,
                  "fwd+bwd and bwd timings (bf16)")

if __name__ == "__main__":
    main()
