"""LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias."""

import torch

from . import (BERT, CLIP, GPT2, LLAMA2, Shape, infer, nbytes, randn, rows_text, shrink, shrink_rows,
               train)

SIZES = {
    "tiny": dict(rows=(2, 5), N=129),  # leading dims > 1, a width that is no power of two
    "small": dict(rows=(4096,), N=1023),
    "bench": dict(rows=(16384,), N=4096),
}
VARIANTS = {"default": {}}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("x", "weight", "bias")
MUTATED: dict = {}
STRIDED = {"x": "row_padded", "weight": "every_other", "bias": "every_other"}
SCALING_DIM = "rows"  # the batch
GRAPH_INPUTS = ("x",)
RATE = "TB/s"  # it moves bytes rather than computing
FUSED_ATEN = ("native_layer_norm", "native_layer_norm_backward", "layer_norm")
NN_MODULES = ("LayerNorm",)
SUITE_GOAL = 1.0


def make_args(shape, dtype, device, generator):
    N = shape["N"]
    return dict(x=randn((*shape["rows"], N), generator, dtype, device, scale=2.0, shift=0.5),
                weight=randn((N,), generator, dtype, device, scale=0.5, shift=1.0),
                bias=randn((N,), generator, dtype, device, scale=0.5),
                eps=1e-5)


def reference(x, weight, bias, eps=1e-5):
    mean = x.sum(dim=-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(dim=-1, keepdim=True) / x.shape[-1]  # biased, as nn.LayerNorm
    return ((x - mean) / torch.sqrt(var + eps) * weight + bias,)


def zero_gradient_scales(args, upstream, grads):
    # Width 1: x - mean(x) is exactly 0, the output is `bias` whatever x is, and grad x is
    # exactly zero. Measure it against the size it has before that cancellation,
    # rstd * weight * dy with rstd = 1/sqrt(eps).
    if args["x"].shape[-1] != 1:
        return {}
    return {"x": upstream[0] * args["weight"] / args["eps"] ** 0.5}


def flops(args):
    n = args["x"].numel()
    return {"fwd": 8 * n, "bwd": 12 * n}


def min_bytes(args):
    x, w, b = args["x"], args["weight"], args["bias"]
    # forward: read x, write y; backward: read x and dy, write dx (weights are noise)
    return {"fwd": 2 * nbytes(x) + nbytes(w, b), "bwd": 3 * nbytes(x) + 3 * nbytes(w, b)}


# ---------------------------------------------------------------------------------------
# The model-shape suite
# ---------------------------------------------------------------------------------------

MODEL_SHAPES = (
    Shape("gpt2-small-train", "GPT-2 small", GPT2 + "; batch 8 x 1024 tokens",
          dict(rows=(8, 1024), N=768), train()),
    Shape("gpt2-medium-train", "GPT-2 medium", GPT2 + "; batch 4 x 1024 tokens",
          dict(rows=(4, 1024), N=1024), train()),
    Shape("gpt2-xl-train", "GPT-2 XL", GPT2 + " (n_embd=1600: no power of two); batch 2 x 1024 "
          "tokens", dict(rows=(2, 1024), N=1600), train()),
    Shape("llama2-7b-train", "Llama 2 7B", LLAMA2 + "; Llama normalizes with RMSNorm: this is "
          "LayerNorm at its width, 4096 tokens", dict(rows=(1, 4096), N=4096), train()),
    Shape("llama2-7b-decode", "Llama 2 7B", LLAMA2 + "; one decoding step for a batch of 8 "
          "sequences: 8 rows, all per-call overhead", dict(rows=(8, 1), N=4096), infer()),
    Shape("bert-base-train", "BERT-base", BERT + "; batch 32 x 512 tokens",
          dict(rows=(32, 512), N=768), train()),
    Shape("clip-text-inference", "CLIP text", CLIP + "; 128 prompts x 77 tokens",
          dict(rows=(128, 77), N=512), infer()),
)


def tiny_twin(s):
    return dict(rows=shrink_rows(s["rows"]), N=shrink(s["N"], 16, low=8))


def describe(s, variants):
    return f"{rows_text(s['rows'])} rows x {s['N']}"


def libraries(device, dtype):
    """F.layer_norm, eager: one fused ATen kernel (torch.compile is a level of ours, not the
    library baseline)."""
    import torch.nn.functional as F

    from ..calls import Impl

    def prepare(args):
        x, w, b, eps = args["x"], args["weight"], args["bias"], args["eps"]
        return (lambda: [F.layer_norm(x, (x.shape[-1],), w, b, eps)]), [x, w, b]

    return [Impl("F.layer_norm", "library", prepare)]


# The kernel's speed at a large problem, measured on an H100 (reports/h100-bench.json,
# bfloat16: forward 16384x4096, 0.98x copy bandwidth): what turns "the host needs T us per
# call" into "the kernel needs longer than that above this size". An estimate: a kernel
# reaches this rate only at large sizes.
H100_TBPS = 2.82


def kernel_dominates_above(host_us: float, source: str) -> str:
    moved = host_us * 1e-6 * H100_TBPS * 1e12  # bytes: read x, write y
    rows = moved / (2 * 2 * 4096)  # bfloat16 rows of 4096, read once and written once
    return (f"at {H100_TBPS} TB/s ({source}) {host_us:.0f} µs moves {moved / 1e6:.0f} MB: a "
            f"layer_norm of about {rows:,.0f} rows of 4096 (x read, y written)")


HOST_PROBE = {"kernel_dominates_above": kernel_dominates_above}
