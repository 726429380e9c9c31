"""Attention: softmax(q k^T * scale) v, optionally causal."""

import math

import torch

from . import nbytes, randn

SIZES = {
    "tiny": dict(B=1, H=2, N=37, D=16),  # N not a multiple of any block size
    "small": dict(B=2, H=4, N=256, D=64),
    "bench": dict(B=4, H=16, N=4096, D=128),
}
VARIANTS = {"full": dict(causal=False), "causal": dict(causal=True)}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("q", "k", "v")
MUTATED: dict = {}


def zero_gradient_scales(args, upstream, grads):
    # One key: a softmax over a single score is exactly 1 whatever q and k are, so out = v
    # and the gradients of q and k are exactly 0; a level's rounding-sized residue divided
    # by a zero norm means nothing. Measure them against the size they have before the
    # softmax's cancellation: dS would be dP = dO . v, so scale * dP k for q and
    # scale * sum_i dP_i q_i for k.
    q, k, v = args["q"], args["k"], args["v"]
    if k.shape[2] != 1:
        return {}
    scale = args.get("scale") or q.shape[-1] ** -0.5
    dp = (upstream[0] * v).sum(-1, keepdim=True)  # (B, H, Nq, 1)
    return {"q": scale * dp * k, "k": scale * (dp * q).sum(2, keepdim=True)}


def strided(args):
    """q, k and v cut out of one packed projection, as a fused qkv Linear produces them:
    a (B, N, 3, H, D) buffer viewed as three (B, H, N, D) tensors (no dimension has unit
    stride but D, and q, k, v interleave in memory)."""
    q = args["q"]
    B, H, N, D = q.shape  # make_args draws k and v of the same shape
    packed = torch.empty((B, N, 3, H, D), dtype=q.dtype, device=q.device)
    for i, name in enumerate(("q", "k", "v")):
        args[name] = packed[:, :, i].transpose(1, 2).copy_(args[name])
    return args


def make_args(shape, dtype, device, generator):
    B, H, N, D = shape["B"], shape["H"], shape["N"], shape["D"]
    return dict(q=randn((B, H, N, D), generator, dtype, device),
                k=randn((B, H, N, D), generator, dtype, device),
                v=randn((B, H, N, D), generator, dtype, device),
                causal=False, scale=None)


def reference(q, k, v, causal=False, scale=None):
    Nq, D = q.shape[-2:]
    Nk = k.shape[-2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:  # query i may look at keys j <= i
        i = torch.arange(Nq, device=q.device)[:, None]
        j = torch.arange(Nk, device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    p = e / e.sum(dim=-1, keepdim=True)
    return (torch.einsum("bhij,bhjd->bhid", p, v),)


def flops(args):
    q, k = args["q"], args["k"]
    B, H, Nq, D = q.shape
    fwd = 4 * B * H * Nq * k.shape[2] * D  # two GEMMs: q k^T and p v
    if args.get("causal"):
        fwd //= 2
    return {"fwd": fwd, "bwd": fwd * 5 // 2}  # five GEMMs in the backward (FlashAttention-2 count)


def min_bytes(args):
    q, k, v = args["q"], args["k"], args["v"]
    return {"fwd": nbytes(q, k, v, q), "bwd": 2 * nbytes(q, k, v, q)}  # + dO, O; dQ, dK, dV
