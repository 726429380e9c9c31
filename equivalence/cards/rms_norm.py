"""RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich
2019), the normalization of Llama, Mistral and Qwen."""

import torch

from . import LLAMA2, Shape, infer, nbytes, randn, train
# x of shape (*rows, N), as LayerNorm's: the same presets, tiny twins and descriptions
from .layer_norm import SIZES, describe, tiny_twin  # noqa: F401 - the card's entries

VARIANTS = {"default": {}}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("x", "weight")
MUTATED: dict = {}
STRIDED = {"x": "row_padded", "weight": "every_other"}
SCALING_DIM = "rows"  # the batch
GRAPH_INPUTS = ("x",)
RATE = "TB/s"  # it moves bytes rather than computing
# F.rms_norm's fused kernels (CUDA, torch >= 2.8). On a CPU with autograd on, torch 2.13
# decomposes F.rms_norm into pointwise ops before the grader's dispatch mode sees it: there
# the grader's first rule (no kernel of yours ran) is what catches a call of it.
FUSED_ATEN = ("rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward")
NN_MODULES = ("RMSNorm",)
SUITE_GOAL = 1.0
# Its kernels (Level 4, the numba twin) are layer_norm's without the mean: an assignment of
# either hides the other's solution too, or the student copy shows the answer there
# (`levels assignment build` refuses it otherwise, naming the lines).
SAME_ALGORITHM_AS = ("layer_norm",)


def make_args(shape, dtype, device, generator):
    N = shape["N"]
    # shifted away from 0: a row's mean square far from eps, as in a trained model
    return dict(x=randn((*shape["rows"], N), generator, dtype, device, scale=2.0, shift=0.5),
                weight=randn((N,), generator, dtype, device, scale=0.5, shift=1.0),
                eps=1e-6)


def reference(x, weight, eps=1e-6):
    ms = (x * x).sum(dim=-1, keepdim=True) / x.shape[-1]
    return (x / torch.sqrt(ms + eps) * weight,)


def zero_gradient_scales(args, upstream, grads):
    # Width 1: y = x / sqrt(x^2 + eps) * w is sign(x) * w up to eps, and grad x =
    # w * dy * eps / (x^2 + eps)^1.5 is what is left of rstd * w * dy * (1 - xhat^2), an
    # eps-sized cancellation: fp32 keeps none of its digits (PyTorch's own F.rms_norm misses
    # the fp32 bound by 86x there). Measure it against the size it has before cancelling.
    if args["x"].shape[-1] != 1:
        return {}
    x, eps = args["x"], args["eps"]
    return {"x": upstream[0] * args["weight"] / torch.sqrt(x * x + eps)}


def flops(args):
    n = args["x"].numel()
    return {"fwd": 4 * n, "bwd": 8 * n}


def min_bytes(args):
    x, w = args["x"], args["weight"]
    # forward: read x, write y; backward: read x and dy, write dx (weight: read, dweight: write)
    return {"fwd": 2 * nbytes(x) + nbytes(w), "bwd": 3 * nbytes(x) + 2 * nbytes(w)}


# ---------------------------------------------------------------------------------------
# The model-shape suite: the widths of the models that normalize with RMSNorm (each layer
# calls it twice, before attention and before the MLP, on every token)
# ---------------------------------------------------------------------------------------

LLAMA3 = ("Llama 3 8B (Meta 2024; HF meta-llama/Meta-Llama-3-8B config.json: hidden_size=4096, "
          "rms_norm_eps=1e-5, max_position_embeddings=8192)")
MISTRAL = ("Mistral 7B (Jiang et al. 2023; HF mistralai/Mistral-7B-v0.1 config.json: "
           "hidden_size=4096, rms_norm_eps=1e-5)")
QWEN2 = ("Qwen2 (Yang et al. 2024; HF Qwen/Qwen2-7B config.json: hidden_size=3584, Qwen/Qwen2-0.5B: "
         "hidden_size=896, both rms_norm_eps=1e-6)")

MODEL_SHAPES = (
    Shape("llama2-7b-train", "Llama 2 7B", LLAMA2 + "; batch 1 x 4096 tokens",
          dict(rows=(1, 4096), N=4096), train()),
    Shape("llama2-7b-decode", "Llama 2 7B", LLAMA2 + "; one decoding step for a batch of 8 "
          "sequences: 8 rows, all per-call overhead", dict(rows=(8, 1), N=4096), infer()),
    Shape("llama3-8b-train", "Llama 3 8B", LLAMA3 + "; batch 1 x 8192 tokens",
          dict(rows=(1, 8192), N=4096), train()),
    Shape("mistral-7b-train", "Mistral 7B", MISTRAL + "; batch 2 x 4096 tokens",
          dict(rows=(2, 4096), N=4096), train()),
    Shape("qwen2-7b-train", "Qwen2 7B", QWEN2 + " (3584: no power of two); batch 1 x 4096 tokens",
          dict(rows=(1, 4096), N=3584), train()),
    Shape("qwen2-0.5b-train", "Qwen2 0.5B", QWEN2 + " (896: no power of two); batch 8 x 1024 "
          "tokens", dict(rows=(8, 1024), N=896), train()),
)


def _eager_math(x, w, eps):
    """RMSNorm op by op, for a torch without F.rms_norm (before 2.4): what a user wrote."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def libraries(device, dtype):
    """F.rms_norm, eager (torch >= 2.4; a fused kernel on the GPU from 2.8), else the eager
    math a user writes (torch.compile is a level of ours, not the library baseline)."""
    import torch.nn.functional as F

    from ..calls import Impl

    fused = getattr(F, "rms_norm", None)

    def prepare(args):
        x, w, eps = args["x"], args["weight"], args["eps"]
        if fused is not None:
            return (lambda: [fused(x, (x.shape[-1],), w, eps)]), [x, w]
        return (lambda: [_eager_math(x, w, eps)]), [x, w]

    return [Impl("F.rms_norm" if fused is not None else "eager RMSNorm math", "library", prepare)]
