"""Where Level 4's host microseconds go, piece by piece (GPU only; issue 12).

    PYTHONPATH=. python3 scripts/probe_host.py        # JSON to $OUT/probe_host.json

Times, calls back to back at a tiny shape, each piece of a Level 4 layer_norm and MLP call
against eager PyTorch: the contract's validation, allocations, the JIT launch
(`kernel[grid]`), the direct launch (triton_kernels/launch.py), the compiled kernel's
launcher alone, autograd.Function.apply. Recorded: reports/h100-host-probe.json."""
import json, os, sys, time, statistics
import torch
import torch.nn.functional as F
import levels
import levels.triton as L4
from levels.contract import validate_layer_norm, validate_mlp
import triton
from triton_kernels import layer_norm as tln, gemm as tg, mlp as tmlp

dev = torch.device("cuda")
res = {}

def host_us(fn, batch=50, reps=40):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t) * 1e6 / batch)
    return round(statistics.median(per), 2)

def cpu_us(fn, n=2000):
    for _ in range(50):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return round((time.perf_counter() - t) * 1e6 / n, 2)

x = torch.randn(4, 37, 64, device=dev, dtype=torch.bfloat16)
w = torch.randn(64, device=dev, dtype=torch.bfloat16)
b = torch.randn(64, device=dev, dtype=torch.bfloat16)
r = {}
r["eager F.layer_norm"] = host_us(lambda: F.layer_norm(x, (64,), w, b, 1e-5))
with torch.no_grad():
    r["eager F.layer_norm no_grad"] = host_us(lambda: F.layer_norm(x, (64,), w, b, 1e-5))
    r["L4 levels.triton.layer_norm no_grad"] = host_us(lambda: L4.layer_norm(x, w, b, 1e-5))
r["L4 levels.triton.layer_norm"] = host_us(lambda: L4.layer_norm(x, w, b, 1e-5))
r["validate_layer_norm"] = cpu_us(lambda: validate_layer_norm(x, w, b, 1e-5))
r["_on_kernel_device"] = cpu_us(lambda: L4._on_kernel_device("layer_norm", "x", x))
r["tln.layer_norm (after validation)"] = host_us(lambda: tln.layer_norm(x, w, b, 1e-5))
r["_LayerNorm.apply"] = host_us(lambda: tln._LayerNorm.apply(x, w, b, 1e-5))
x2 = x.reshape(-1, 64)
M, N = x2.shape
y = torch.empty_like(x2); mean = torch.empty(M, device=dev); rstd = torch.empty(M, device=dev)
BM, BN, nw = tln._tiling(N, 2)
g = (triton.cdiv(M, BM),)
launch = lambda: tln.layer_norm_fwd_kernel[g](x2, w, b, y, mean, rstd, M, N, x2.stride(0), y.stride(0), 1e-5, BLOCK_M=BM, BLOCK_N=BN, num_warps=nw)
r["JIT launch only"] = host_us(launch)
from triton_kernels.launch import launch as fast_launch
r["fast launch only"] = host_us(lambda: fast_launch(tln.layer_norm_fwd_kernel, g, x2, w, b, y, mean, rstd, M, N, x2.stride(0), y.stride(0), 1e-5, BLOCK_M=BM, BLOCK_N=BN, num_warps=nw))
__import__("triton_kernels.launch").launch.ENABLED = False
with torch.no_grad():
    r["L4 levels.triton.layer_norm no_grad, fast launch OFF"] = host_us(lambda: L4.layer_norm(x, w, b, 1e-5))
__import__("triton_kernels.launch").launch.ENABLED = True
r["3x torch.empty"] = cpu_us(lambda: (torch.empty((M, N), device=dev, dtype=x.dtype), torch.empty((M,), device=dev, dtype=torch.float32), torch.empty((M,), device=dev, dtype=torch.float32)))
r["1x torch.empty"] = cpu_us(lambda: torch.empty((M, N), device=dev, dtype=x.dtype))
r["empty_like"] = cpu_us(lambda: torch.empty_like(x2))
r["x.reshape"] = cpu_us(lambda: x.reshape(-1, 64))
r["w.contiguous"] = cpu_us(lambda: w.contiguous())
r["torch.is_grad_enabled"] = cpu_us(lambda: torch.is_grad_enabled())
r["x.data_ptr"] = cpu_us(lambda: x.data_ptr())
r["x.stride(0)"] = cpu_us(lambda: x2.stride(0))
r["x.shape"] = cpu_us(lambda: x.shape)
r["torch.cuda.current_stream"] = cpu_us(lambda: torch.cuda.current_stream())
from triton.runtime import driver
r["driver get_current_device"] = cpu_us(lambda: driver.active.get_current_device())
d0 = driver.active.get_current_device()
r["driver get_current_stream"] = cpu_us(lambda: driver.active.get_current_stream(d0))
# compiled-kernel direct path
ck = launch()
print("run returned", type(ck))
try:
    args = (x2, w, b, y, mean, rstd, M, N, x2.stride(0), y.stride(0), 1e-5, BM, BN)
    r["CompiledKernel[grid](...) all args"] = host_us(lambda: ck[(g[0], 1, 1)](*args))
except Exception as e:
    r["CompiledKernel[grid] error"] = repr(e)[:300]
try:
    stream = driver.active.get_current_stream(d0)
    fn = ck.function; pm = ck.packed_metadata
    run = ck.run
    def raw():
        run(g[0], 1, 1, stream, fn, pm, None, None, None, x2, w, b, y, mean, rstd, M, N, x2.stride(0), y.stride(0), 1e-5, BM, BN)
    r["ck.run raw"] = host_us(raw)
    # correctness of raw path
    y.fill_(float('nan')); raw(); torch.cuda.synchronize()
    ref = F.layer_norm(x2.float(), (64,), w.float(), b.float(), 1e-5)
    r["ck.run raw maxerr"] = float((y.float() - ref).abs().max())
except Exception as e:
    r["ck.run raw error"] = repr(e)[:300]
res["layer_norm"] = r

# MLP tiny
r = {}
M, K, H, Nn = 148, 64, 256, 64
xm = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
w1 = torch.randn(H, K, device=dev, dtype=torch.bfloat16) * 0.1; b1 = torch.randn(H, device=dev, dtype=torch.bfloat16)
w2 = torch.randn(Nn, H, device=dev, dtype=torch.bfloat16) * 0.1; b2 = torch.randn(Nn, device=dev, dtype=torch.bfloat16)
eager = lambda: F.linear(F.gelu(F.linear(xm, w1, b1)), w2, b2)
with torch.no_grad():
    r["eager mlp no_grad"] = host_us(eager)
    r["L4 mlp no_grad"] = host_us(lambda: L4.mlp(xm, w1, b1, w2, b2))
    __import__("triton_kernels.launch").launch.ENABLED = False
    r["L4 mlp no_grad, fast launch OFF"] = host_us(lambda: L4.mlp(xm, w1, b1, w2, b2))
    __import__("triton_kernels.launch").launch.ENABLED = True
r["eager mlp"] = host_us(eager)
r["L4 mlp"] = host_us(lambda: L4.mlp(xm, w1, b1, w2, b2))
r["validate_mlp"] = cpu_us(lambda: validate_mlp(xm, w1, b1, w2, b2))
r["tmlp.mlp"] = host_us(lambda: tmlp.mlp(xm, w1, b1, w2, b2))
out = torch.empty(M, H, device=dev, dtype=torch.bfloat16)
r["tg.gemm gelu into out"] = host_us(lambda: tg.gemm(xm, w1.t(), b1, activation="gelu", out=out))
r["tg.gemm gelu into out, check=False"] = host_us(lambda: tg.gemm(xm, w1.t(), b1, activation="gelu", out=out, check=False))
r["tg.tile_for"] = cpu_us(lambda: tg.tile_for(M, H, tg.sm_count(dev)))
r["tg.sm_count"] = cpu_us(lambda: tg.sm_count(dev))
res["mlp"] = r

# fwd+bwd layer_norm
r = {}
xg = x.clone().requires_grad_(); wg = w.clone().requires_grad_(); bg = b.clone().requires_grad_()
dy = torch.randn_like(x)
def eb():
    F.layer_norm(xg, (64,), wg, bg, 1e-5).backward(dy)
def tb():
    L4.layer_norm(xg, wg, bg, 1e-5).backward(dy)
r["eager fwd+bwd"] = host_us(eb, batch=20)
r["L4 fwd+bwd"] = host_us(tb, batch=20)
__import__("triton_kernels.launch").launch.ENABLED = False
r["L4 fwd+bwd, fast launch OFF"] = host_us(tb, batch=20)
__import__("triton_kernels.launch").launch.ENABLED = True
# attention tiny
q = torch.randn(1, 2, 37, 16, device=dev, dtype=torch.bfloat16)
with torch.no_grad():
    r["attn eager sdpa no_grad"] = host_us(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    r["attn L4 no_grad"] = host_us(lambda: L4.attention(q, q, q, True))
res["layer_norm_bwd"] = r
print(json.dumps(res, indent=1))
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_host.json"), "w"), indent=1)
