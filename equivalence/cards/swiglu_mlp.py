"""SwiGLU MLP, Llama's: down(silu(x W_gate^T) * (x W_up^T)), weights as nn.Linear's, no biases."""

import torch

from . import LLAMA2, Shape, infer, nbytes, prod, randn, shrink, shrink_rows, train

SIZES = {
    # hidden 44: no multiple of the interpreter's 32-wide tile, K 24: a masked K step
    "tiny": dict(rows=(2, 9), K=24, hidden=44, N=20),
    "small": dict(rows=(256,), K=256, hidden=688, N=256),
    "bench": dict(rows=(1, 4096), K=4096, hidden=11008, N=4096),  # Llama 2 7B, one sequence
}
VARIANTS = {"default": {}}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("x", "w_gate", "w_up", "w_down")
MUTATED: dict = {}
STRIDED = {"x": "row_padded", "w_gate": "transposed", "w_up": "transposed",
           "w_down": "transposed"}
SCALING_DIM = "rows"  # the tokens
GRAPH_INPUTS = ("x",)
# A kernel level's own code is the SiLU-multiply in its GEMM epilogues (forward and
# derivative): dispatching torch's silu (or its backward) would be Level 1's epilogue.
FUSED_ATEN = ("silu", "silu_backward")
NN_MODULES = ("SwiGLUMLP",)
SUITE_GOAL = 0.9
SOLUTION_FILES = {"cuda": "cuda_kernels/gemm.cu"}  # its SiLU-mul epilogues live in the GEMM


def make_args(shape, dtype, device, generator):
    K, Hd, N = shape["K"], shape["hidden"], shape["N"]
    # Scaled so that the gate's pre-activations are O(1): SiLU's curved part, where a
    # wrong derivative shows, not its linear tail.
    return dict(x=randn((*shape["rows"], K), generator, dtype, device),
                w_gate=randn((Hd, K), generator, dtype, device, scale=K ** -0.5),
                w_up=randn((Hd, K), generator, dtype, device, scale=K ** -0.5),
                w_down=randn((N, Hd), generator, dtype, device, scale=Hd ** -0.5))


def reference(x, w_gate, w_up, w_down):
    g = x @ w_gate.T
    u = x @ w_up.T
    return ((g * torch.sigmoid(g) * u) @ w_down.T,)


def flops(args):
    M = args["x"].numel() // args["x"].shape[-1]
    Hd, K = args["w_gate"].shape
    N = args["w_down"].shape[0]
    fwd = 2 * (2 * M * K * Hd) + 2 * M * Hd * N  # gate and up, then down
    return {"fwd": fwd, "bwd": 2 * fwd}  # dX and dW for each GEMM


def min_bytes(args):
    x, wg, wu, wd = (args[k] for k in ("x", "w_gate", "w_up", "w_down"))
    out = x.numel() // x.shape[-1] * wd.shape[0] * x.element_size()
    once = nbytes(x, wg, wu, wd) + out
    return {"fwd": once, "bwd": 2 * once}


# ---------------------------------------------------------------------------------------
# The model-shape suite: the SwiGLU MLPs of today's open models, each from its published
# configuration (hidden_size -> intermediate_size)
# ---------------------------------------------------------------------------------------

LLAMA3 = ("Llama 3 8B (Meta 2024; HF meta-llama/Meta-Llama-3-8B config.json: hidden_size=4096, "
          "intermediate_size=14336, max_position_embeddings=8192)")
MISTRAL = ("Mistral 7B (Jiang et al. 2023, Table 1; HF mistralai/Mistral-7B-v0.1 config.json: "
           "hidden_size=4096, intermediate_size=14336, sliding_window=4096)")
QWEN2 = ("Qwen2 7B (Qwen team 2024, Table 1; HF Qwen/Qwen2-7B config.json: hidden_size=3584, "
         "intermediate_size=18944)")

MODEL_SHAPES = (
    Shape("llama2-7b-train", "Llama 2 7B", LLAMA2 + "; gate and up 4096 -> 11008, down 11008 -> "
          "4096, one 4096-token sequence", dict(rows=(1, 4096), K=4096, hidden=11008, N=4096),
          train()),
    Shape("llama2-7b-decode", "Llama 2 7B", LLAMA2 + "; one decoding step for 8 sequences: M = 8, "
          "reading 270 MB of weights per call (a bandwidth problem)",
          dict(rows=(8, 1), K=4096, hidden=11008, N=4096), infer()),
    Shape("llama3-8b-train", "Llama 3 8B", LLAMA3 + "; one 8192-token sequence",
          dict(rows=(1, 8192), K=4096, hidden=14336, N=4096), train()),
    Shape("mistral-7b-train", "Mistral 7B", MISTRAL + "; one 4096-token window",
          dict(rows=(1, 4096), K=4096, hidden=14336, N=4096), train()),
    Shape("llama3-8b-decode", "Llama 3 8B", LLAMA3 + "; one decoding step for 16 sequences: "
          "M = 16, reading 352 MB of weights per call", dict(rows=(16, 1), K=4096, hidden=14336,
                                                              N=4096), infer()),
    Shape("qwen2-7b-train", "Qwen2 7B", QWEN2 + "; one 4096-token sequence (hidden 18944: no "
          "multiple of 256)", dict(rows=(1, 4096), K=3584, hidden=18944, N=3584), train()),
)


def tiny_twin(s):
    # widths / 32 (mlp's / 16): three weight matrices, and the suite's CPU run holds a twin
    # under 500k elements
    return dict(rows=shrink_rows(s["rows"]), K=shrink(s["K"], 32, low=8),
                hidden=shrink(s["hidden"], 32, low=8), N=shrink(s["N"], 32, low=8))


def describe(s, variants):
    return f"M{prod(s['rows'])} {s['K']}->2x{s['hidden']}->{s['N']}"


def libraries(device, dtype):
    """F.linear x2 -> F.silu * up -> F.linear, eager: three cuBLAS GEMMs, SiLU and the product
    as two kernels of their own (Llama's reference code, HF LlamaMLP)."""
    import torch.nn.functional as F

    from ..calls import Impl

    def prepare(args):
        x, wg, wu, wd = (args[n] for n in ("x", "w_gate", "w_up", "w_down"))
        return (lambda: [F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)]), [x, wg, wu, wd]

    on_gpu = device.type == "cuda"
    return [Impl("F.linear+silu*up (cuBLAS)" if on_gpu else "F.linear+silu*up", "library",
                 prepare, tf32=on_gpu and torch.backends.cuda.matmul.allow_tf32)]
