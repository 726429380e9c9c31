"""MLP: linear -> GELU (exact, erf) -> linear, weights laid out as nn.Linear's."""

import math

import torch

from . import (CLIP, GPT2, LLAMA2, VIT, Shape, infer, nbytes, prod, randn, shrink, shrink_rows,
               train)

SIZES = {
    "tiny": dict(rows=(2, 9), K=24, hidden=72, N=20),
    "small": dict(rows=(256,), K=256, hidden=1024, N=256),
    "bench": dict(rows=(8192,), K=4096, hidden=16384, N=4096),
}
VARIANTS = {"default": {}}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("x", "w1", "b1", "w2", "b2")
MUTATED: dict = {}
STRIDED = {"x": "row_padded", "w1": "transposed", "b1": "every_other", "w2": "transposed",
           "b2": "every_other"}
SCALING_DIM = "rows"  # the batch
GRAPH_INPUTS = ("x",)
FUSED_ATEN = ("gelu", "gelu_backward")
NN_MODULES = ("MLP",)
SUITE_GOAL = 0.9
# The MLP's own code at the kernel levels is its GEMM's GELU epilogue (forward and derivative)
SOLUTION_FILES = {"cuda": "cuda_kernels/gemm.cu", "triton": "triton_kernels/gemm.py",
                  "numba": "numba_kernels/gemm.py"}


def make_args(shape, dtype, device, generator):
    K, Hd, N = shape["K"], shape["hidden"], shape["N"]
    return dict(x=randn((*shape["rows"], K), generator, dtype, device),
                w1=randn((Hd, K), generator, dtype, device, scale=K ** -0.5),
                b1=randn((Hd,), generator, dtype, device, scale=0.5),
                w2=randn((N, Hd), generator, dtype, device, scale=Hd ** -0.5),
                b2=randn((N,), generator, dtype, device, scale=0.5))


def reference(x, w1, b1, w2, b2):
    h = x @ w1.T + b1
    g = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    return (g @ w2.T + b2,)


def flops(args):
    M = args["x"].numel() // args["x"].shape[-1]
    Hd, K = args["w1"].shape
    N = args["w2"].shape[0]
    fwd = 2 * M * K * Hd + 2 * M * Hd * N
    return {"fwd": fwd, "bwd": 2 * fwd}  # dX and dW for each GEMM


def min_bytes(args):
    x, w1, b1, w2, b2 = (args[k] for k in ("x", "w1", "b1", "w2", "b2"))
    out = x.numel() // x.shape[-1] * w2.shape[0] * x.element_size()
    return {"fwd": nbytes(x, w1, b1, w2, b2) + out, "bwd": 2 * (nbytes(x, w1, b1, w2, b2) + out)}


# ---------------------------------------------------------------------------------------
# The model-shape suite
# ---------------------------------------------------------------------------------------

MODEL_SHAPES = (
    Shape("gpt2-small-train", "GPT-2 small", GPT2 + "; MLP 768 -> 3072 -> 768, batch 8 x 1024 "
          "tokens", dict(rows=(8, 1024), K=768, hidden=3072, N=768), train()),
    Shape("gpt2-medium-train", "GPT-2 medium", GPT2 + "; MLP 1024 -> 4096 -> 1024, batch 4 x 1024",
          dict(rows=(4, 1024), K=1024, hidden=4096, N=1024), train()),
    Shape("gpt2-small-prefill", "GPT-2 small", GPT2 + "; inference on a 1000-token prompt (Level 4 "
          "once measured 0.17x cuBLAS here, before its small-shape tiles)",
          dict(rows=(1, 1000), K=768, hidden=3072, N=768), infer()),
    Shape("llama2-7b-train", "Llama 2 7B", LLAMA2 + "; Llama's MLP is SwiGLU (gate and up 4096 -> "
          "11008, down 11008 -> 4096): here the same two GEMM shapes around a GELU, one 4096-token "
          "sequence", dict(rows=(1, 4096), K=4096, hidden=11008, N=4096), train()),
    Shape("llama2-7b-decode", "Llama 2 7B", LLAMA2 + "; one decoding step for 8 sequences: M = 8, "
          "reading 180 MB of weights per call (a bandwidth problem)",
          dict(rows=(8, 1), K=4096, hidden=11008, N=4096), infer()),
    Shape("vit-b16-train", "ViT-B/16", VIT + "; batch 64 x 197 tokens: M = 12608, no multiple of "
          "128", dict(rows=(64, 197), K=768, hidden=3072, N=768), train()),
    Shape("clip-text-inference", "CLIP text", CLIP + "; 128 prompts x 77 tokens",
          dict(rows=(128, 77), K=512, hidden=2048, N=512), infer()),
)


def tiny_twin(s):
    return dict(rows=shrink_rows(s["rows"]), K=shrink(s["K"], 16, low=8),
                hidden=shrink(s["hidden"], 16, low=8), N=shrink(s["N"], 16, low=8))


def describe(s, variants):
    return f"M{prod(s['rows'])} {s['K']}->{s['hidden']}->{s['N']}"


def libraries(device, dtype):
    """F.linear -> F.gelu -> F.linear, eager: cuBLAS GEMMs with the bias, GELU its own kernel."""
    import torch.nn.functional as F

    from ..calls import Impl

    def prepare(args):
        x, w1, b1, w2, b2 = (args[n] for n in ("x", "w1", "b1", "w2", "b2"))
        return (lambda: [F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)]), [x, w1, b1, w2, b2]

    on_gpu = device.type == "cuda"
    # cuBLAS runs fp32 GEMMs in TF32 only if torch.backends.cuda.matmul.allow_tf32 says so
    return [Impl("F.linear+gelu (cuBLAS)" if on_gpu else "F.linear+gelu", "library", prepare,
                 tf32=on_gpu and torch.backends.cuda.matmul.allow_tf32)]


# The kernels' speed at a large problem, measured on an H100 (reports/h100-bench.json,
# bfloat16: forward 8192 x 4096 -> 16384 -> 4096); an estimate, as layer_norm's.
H100_TFLOPS = 565.0


def kernel_dominates_above(host_us: float, source: str) -> str:
    flops_ = host_us * 1e-6 * H100_TFLOPS * 1e12
    per_row = 2 * 2 * 4096 * 16384  # two GEMMs, 4096 -> 16384 -> 4096
    return (f"at {H100_TFLOPS:.0f} TFLOP/s ({source}) {host_us:.0f} µs is {flops_ / 1e9:.0f} "
            f"GFLOP: an MLP 4096 -> 16384 -> 4096 on about {flops_ / per_row:,.0f} rows")


def fix_note(rows: dict, raw: dict) -> str:
    """The MLP's own host-time fix: Level 4 checks its GEMMs' operands once, not per GEMM."""
    own = rows.get("one GEMM with its own checks")
    unchecked = raw.get("mlp", {}).get("tg.gemm gelu into out, check=False")
    if own is None or unchecked is None:
        return ""
    return (f"; checking the GEMM operands again in each launch would add {own - unchecked:.1f} "
            f"µs a GEMM, so Level 4 passes check=False")


# The host probe (equivalence/commands/host_probe.py; the recorder `rec` is described in
# cards/layer_norm.py): every piece of a tiny Level 4 MLP call, keys as in the recorded
# reports/h100-host-probe.json.
PROBE_SHAPES = "x (148, 64), w1 (256, 64), w2 (64, 256), bfloat16: 148 rows, 64 -> 256 -> 64"


def host_probe(rec, device) -> None:
    import torch.nn.functional as F

    import levels.triton as L4
    from levels.contract import validate_mlp
    from triton_kernels import gemm as tg
    from triton_kernels import mlp as tmlp

    M, K, H, Nn = 148, 64, 256, 64
    xm = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    w1 = torch.randn(H, K, device=device, dtype=torch.bfloat16) * 0.1
    b1 = torch.randn(H, device=device, dtype=torch.bfloat16)
    w2 = torch.randn(Nn, H, device=device, dtype=torch.bfloat16) * 0.1
    b2 = torch.randn(Nn, device=device, dtype=torch.bfloat16)

    def eager():
        return F.linear(F.gelu(F.linear(xm, w1, b1)), w2, b2)

    with torch.no_grad():
        rec.host("eager mlp no_grad", eager)
        rec.host("L4 mlp no_grad", lambda: L4.mlp(xm, w1, b1, w2, b2))
        rec.host("L4 mlp no_grad, fast launch OFF", lambda: L4.mlp(xm, w1, b1, w2, b2),
                 jit_launches=True)
    rec.host("eager mlp", eager)
    rec.host("L4 mlp", lambda: L4.mlp(xm, w1, b1, w2, b2))
    rec.cpu("validate_mlp", lambda: validate_mlp(xm, w1, b1, w2, b2))
    rec.host("tmlp.mlp", lambda: tmlp.mlp(xm, w1, b1, w2, b2))
    out = torch.empty(M, H, device=device, dtype=torch.bfloat16)
    rec.host("tg.gemm gelu into out", lambda: tg.gemm(xm, w1.t(), b1, activation="gelu", out=out))
    rec.host("tg.gemm gelu into out, check=False",
             lambda: tg.gemm(xm, w1.t(), b1, activation="gelu", out=out, check=False))
    rec.cpu("tg.tile_for", lambda: tg.tile_for(M, H, tg.sm_count(device)))
    rec.cpu("tg.sm_count", lambda: tg.sm_count(device))
    with torch.no_grad():
        rec.gpu_time(lambda: L4.mlp(xm, w1, b1, w2, b2))


# How the pieces add up (rows as in cards/layer_norm.py's HOST_PROBE_LAYOUT).
HOST_PROBE_LAYOUT = dict(
    call="levels.triton.mlp(x, w1, b1, w2, b2) under torch.no_grad()",
    shapes=PROBE_SHAPES,
    total=("the Level 4 call", "levels.triton.mlp: all the above", ("L4 mlp no_grad",)),
    eager=("eager F.linear/gelu/linear", "3 C++ calls (cuBLAS addmm, gelu, addmm)",
           ("eager mlp no_grad",)),
    pieces=(
        ("validate_mlp", "contract checks in Python (eager: in C++)", ("validate_mlp",)),
        ("Level 4's own checks *", "device, 32-bit offsets, glue",
         ("L4 mlp no_grad", "validate_mlp", "tmlp.mlp")),
        ("2 GEMMs (one timed, x 2)", "tile, key, launcher; output given",
         ("2x", "tg.gemm gelu into out, check=False")),
    ),
    rest="2 output allocs, reshape, Python glue",
    footnote="* the Level 4 call minus validate_mlp minus triton_kernels.mlp.mlp (timed "
             "with grad on, inputs without requires_grad: the same no-apply path)",
    alternatives=(
        ("one GEMM with its own checks", "gemm(check=True): operands checked again",
         ("tg.gemm gelu into out",)),
        ("the call, direct launches off", "every launch through kernel[grid]",
         ("L4 mlp no_grad, fast launch OFF",)),
        ("GEMM tile choice (tile_for)", "in each GEMM launch: from M, N and the SMs", ("tg.tile_for",)),
    ),
)

HOST_PROBE = {"kernel_dominates_above": kernel_dominates_above, "fix_note": fix_note,
              "measure": {"mlp": host_probe}, "layout": HOST_PROBE_LAYOUT}
