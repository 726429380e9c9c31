"""LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias."""

import torch

from . import nbytes, randn

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
