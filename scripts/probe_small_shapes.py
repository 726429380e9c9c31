"""Kernel time against end-to-end time at the suite's small shapes (GPU only).

    PYTHONPATH=. python3 scripts/probe_small_shapes.py      # JSON to $OUT/small-shapes.json

Three questions the model-shape suite cannot answer by itself, each by kernel time (the
sum of the call's kernels in torch.profiler's CUDA events) next to do_bench's per-call
time, which at these sizes often measures the host instead:

1. Small-M GEMMs (decode: M = 8): the size rule's tile and split-K (gemm.small_m_tile,
   gemm.split_k_for, gemm.tile_for) against other tiles and split counts, and cuBLAS, per
   GEMM of Llama-2 7B's and GPT-2's MLP.
2. Small convolutions: a Level 4 conv_bn eval call's kernels and host time next to cuDNN's,
   with the forward tile rule and with 128-row tiles.
3. Attention at D = 64: forward and backward block shapes against SDPA's backends.

Recorded: reports/h100-small-shapes.json (reports/h100-small-shapes-first-sweep.json: the
first, wider sweep, before kernel times were taken for the GEMMs)."""
import json
import os
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import levels.triton as L4
from equivalence.timing import time_host
from triton_kernels import gemm as G

dev = torch.device("cuda")
torch.manual_seed(0)
res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "triton": triton.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "gemm": [], "conv": []}
sms = G.sm_count(dev)


def bench_us(fn):
    return round(do_bench(fn, warmup=25, rep=100) * 1000, 2)


def host_us(fn):
    """Host time per call, calls back to back (the timer of `levels bench --overhead`)."""
    return round(time_host(fn, dev, min_time_s=0.2, warmup=20, batch=200).median_ms * 1e3, 2)


def kernel_us(fn, reps=20):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] = per.get(e.name, 0.0) + e.device_time / reps
    return {k[:60]: round(v, 2) for k, v in per.items()}


# --- 1. small-M GEMMs ------------------------------------------------------------------
GEMMS = [("llama2-7b decode W1", 8, 4096, 11008), ("llama2-7b decode W2", 8, 11008, 4096),
         ("gpt2 decode W1", 8, 768, 3072), ("gpt2 decode W2", 8, 3072, 768),
         ("llama2-7b M=32 W1", 32, 4096, 11008), ("gpt2-small prefill W2", 1000, 3072, 768),
         ("gpt2-small prefill W1", 1000, 768, 3072)]
for name, M, K, N in GEMMS:
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * K ** -0.5
    bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
    ref = F.linear(a.float(), w.float(), bias.float())
    row = {"gemm": name, "M": M, "K": K, "N": N,
           "cublas_us": bench_us(lambda: F.linear(a, w, bias))}
    if M <= G.SMALL_M:
        rule = G.small_m_tile(M, K)
    else:
        rule = G._TILE_ARGS[id(G.tile_for(M, N, sms))]
    row["rule"] = dict(rule, SPLIT_K=G.split_k_for(M, N, K, rule, sms))
    out = G.gemm(a, w.t(), bias)
    row["rule_rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()
    row["rule_us"] = bench_us(lambda: G.gemm(a, w.t(), bias))
    row["rule_kernels_us"] = kernel_us(lambda: G.gemm(a, w.t(), bias))
    row["cublas_kernels_us"] = kernel_us(lambda: F.linear(a, w, bias))
    row["rule_host_us"] = host_us(lambda: G.gemm(a, w.t(), bias))
    row["cublas_host_us"] = host_us(lambda: F.linear(a, w, bias))
    sweep = []
    bms = [max(16, triton.next_power_of_2(M))] if M <= G.SMALL_M else [128]
    for bm in bms:
        for bn in (64, 128):
            for bk in (128,) if M <= G.SMALL_M else (64,):
                for split in (1, 2, 3, 4, 8):
                    if K // split < 2 * bk:
                        continue
                    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8 if bm >= 64 else 1,
                               num_warps=4 if bm <= 64 else 8,
                               num_stages=3 if bm * bk + bk * bn >= 16384 else 4, SPLIT_K=split)
                    def pinned(cfg=cfg):  # this tile, as gemm's `config` argument
                        return G.gemm(a, w.t(), bias, config=cfg)
                    try:
                        o = pinned()
                        err = ((o.float() - ref).norm() / ref.norm()).item()
                        ks = kernel_us(pinned)
                        sweep.append(dict(cfg, us=bench_us(pinned), kernels_us=ks,
                                          kernel_total_us=round(sum(ks.values()), 2), rel_err=err))
                    except Exception as exc:  # noqa: BLE001 - recorded, not hidden
                        sweep.append(dict(cfg, error=f"{type(exc).__name__}: {exc}"[:200]))
    row["sweep"] = sweep
    ok = [s for s in sweep if "us" in s]
    if ok:  # by kernel time: do_bench's per-call events include the host when it is slower
        best = min(ok, key=lambda s: s["kernel_total_us"])
        row["best"] = best
    print(f"{name:24s} kernels: cuBLAS {sum(row['cublas_kernels_us'].values()):6.1f} us  rule "
          f"{sum(row['rule_kernels_us'].values()):6.1f} us (split {row['rule']['SPLIT_K']})  "
          f"best {row.get('best', {}).get('kernel_total_us')} "
          f"{ {k: row.get('best', {}).get(k) for k in ('BLOCK_M', 'BLOCK_N', 'BLOCK_K', 'SPLIT_K')} }",
          flush=True)
    res["gemm"].append(row)

# --- 2. small convolutions: kernel vs host ----------------------------------------------
CONVS = [("resnet50-layer3-1x1", 32, 1024, 14, 256, 1, 1, 0),
         ("resnet50-layer3-3x3", 32, 256, 14, 256, 3, 1, 1),
         ("resnet50-layer4-3x3", 32, 512, 7, 512, 3, 1, 1),
         ("resnet50-layer4-1x1-infer", 1, 512, 7, 2048, 1, 1, 0),
         ("resnet50-layer1-3x3", 32, 64, 56, 64, 3, 1, 1)]


for name, N, Ci, H, Co, k, stride, pad in CONVS:
    x = torch.randn(N, Ci, H, H, device=dev, dtype=torch.bfloat16).to(
        memory_format=torch.channels_last)
    w = (torch.randn(Co, Ci, k, k, device=dev, dtype=torch.bfloat16) * (Ci * k * k) ** -0.5)
    b = torch.randn(Co, device=dev, dtype=torch.bfloat16)
    g, be = torch.rand(Co, device=dev, dtype=torch.bfloat16) + 0.5, torch.randn(
        Co, device=dev, dtype=torch.bfloat16)
    rm, rv = torch.randn(Co, device=dev, dtype=torch.bfloat16), torch.rand(
        Co, device=dev, dtype=torch.bfloat16) + 0.5
    args = (x, w, b, g, be, rm, rv, stride, pad, 1e-5, 0.1, False)

    def ours():
        return L4.conv_bn(*args)

    def eager():
        return F.batch_norm(F.conv2d(x, w, b, stride, pad), rm, rv, g, be, False, 0.1, 1e-5)

    import triton_kernels.conv_bn as TC
    rule = TC._fwd_tile

    def rows128(P, C_in, C_out, device):
        cfg = rule(P, C_in, C_out, device)
        return dict(cfg, BLOCK_M=128, num_warps=8 if cfg["BLOCK_N"] > 64 else 4)

    with torch.no_grad():
        TC._fwd_tile = rows128
        try:
            old_rule_kernels = kernel_us(ours)
        finally:
            TC._fwd_tile = rule
        want = eager().float()
        got = ours().float()
        row = {"conv": name, "rel_err": ((got - want).norm() / want.norm()).item(),
               "ours_kernels_us": kernel_us(ours), "cudnn_kernels_us": kernel_us(eager),
               "tile": rule(N * ((H + 2 * pad - k) // stride + 1) ** 2, Ci, Co, dev),
               "ours_128_row_tile_kernels_us": old_rule_kernels,
               "ours_host_us": host_us(ours), "cudnn_host_us": host_us(eager),
               "ours_bench_us": bench_us(ours), "cudnn_bench_us": bench_us(eager)}
    print(f"{name:26s} ours: kernels {sum(row['ours_kernels_us'].values()):7.1f} us "
          f"(128-row tile {sum(old_rule_kernels.values()):6.1f}), "
          f"host {row['ours_host_us']:6.1f}, do_bench {row['ours_bench_us']:6.1f} | cuDNN: "
          f"kernels {sum(row['cudnn_kernels_us'].values()):6.1f}, host {row['cudnn_host_us']:6.1f}, "
          f"do_bench {row['cudnn_bench_us']:6.1f}  rel_err {row['rel_err']:.1e}", flush=True)
    res["conv"].append(row)

# --- 3. attention at D = 64: which blocks, forward and backward -------------------------
import triton_kernels.attention as TA  # noqa: E402

res["attention"] = []
ATTN = [("gpt2-small-train", 8, 12, 1024, 64, True), ("vit-b16-train", 64, 12, 197, 64, False),
        ("bert-base-train", 32, 12, 512, 64, False)]
FWD = [(128, 64, 4, 3), (64, 64, 4, 3), (64, 32, 4, 4)]
BWD = [(64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3)]
for name, B, H, Nn, D, causal in ATTN:
    q, k, v = (torch.randn(B, H, Nn, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn(B, H, Nn, D, device=dev, dtype=torch.bfloat16)
    row = {"shape": name, "B": B, "H": H, "N": Nn, "D": D, "causal": causal, "fwd": [], "bwd": []}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            try:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                row[f"sdpa_{backend.name}_fwd_us"] = bench_us(
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                row[f"sdpa_{backend.name}_bwd_us"] = bench_us(
                    lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
            except Exception as exc:  # noqa: BLE001
                row[f"sdpa_{backend.name}"] = f"{type(exc).__name__}: {exc}"[:200]
    saved = dict(TA.TUNED)
    try:
        for bm, bn, nw, ns in FWD:
            TA.TUNED["fwd_small_d"] = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=ns)
            try:
                fwd = lambda: L4.attention(q.detach(), k.detach(), v.detach(), causal)  # noqa: E731
                row["fwd"].append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=ns,
                                       us=bench_us(fwd), kernels_us=kernel_us(fwd)))
            except Exception as exc:  # noqa: BLE001
                row["fwd"].append(dict(BLOCK_M=bm, BLOCK_N=bn, error=f"{type(exc).__name__}"))
        TA.TUNED.update(saved)
        o = L4.attention(q, k, v, causal)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        gref = torch.autograd.grad(ref, (q, k, v), do.float())
        for bm, bn, nw, ns in BWD:
            TA.TUNED["bwd"] = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=ns)
            try:
                g = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                err = max(((a.float() - b).norm() / b.norm()).item() for a, b in zip(g, gref))
                row["bwd"].append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=ns,
                                       rel_err=err, us=bench_us(lambda: torch.autograd.grad(
                                           o, (q, k, v), do, retain_graph=True)),
                                       kernels_us=kernel_us(lambda: torch.autograd.grad(
                                           o, (q, k, v), do, retain_graph=True))))
            except Exception as exc:  # noqa: BLE001
                row["bwd"].append(dict(BLOCK_M=bm, BLOCK_N=bn, error=f"{type(exc).__name__}: {exc}"[:200]))
    finally:
        TA.TUNED.clear()
        TA.TUNED.update(saved)
    print(name, {k: v for k, v in row.items() if k.startswith("sdpa")}, flush=True)
    for part in ("fwd", "bwd"):
        for c in row[part]:
            print(f"  {part} {c.get('BLOCK_M')}x{c.get('BLOCK_N')} w{c.get('num_warps')} "
                  f"s{c.get('num_stages')}: {c.get('us', c.get('error'))} us, kernels "
                  f"{sum(c.get('kernels_us', {}).values()):.1f} us", flush=True)
    res["attention"].append(row)

out = os.path.join(os.environ.get("OUT", "."), "small-shapes.json")
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("wrote", out)
