"""MLP: linear -> GELU (exact, erf) -> linear, weights laid out as nn.Linear's."""

import math

import torch

from . import nbytes, randn

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
