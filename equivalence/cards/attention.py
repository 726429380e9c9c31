"""Attention: softmax(q k^T * scale) v, optionally causal."""

import contextlib
import math

import torch

from . import BERT, CLIP, GPT2, LLAMA2, VIT, WHISPER, Shape, infer, nbytes, randn, shrink, train

SIZES = {
    "tiny": dict(B=1, H=2, N=37, D=16),  # N not a multiple of any block size
    "small": dict(B=2, H=4, N=256, D=64),
    "bench": dict(B=4, H=16, N=4096, D=128),
}
VARIANTS = {"full": dict(causal=False), "causal": dict(causal=True)}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("q", "k", "v")
MUTATED: dict = {}
SCALING_DIM = "N"  # the sequence: what a user grows first
GRAPH_INPUTS = ("q", "k", "v")
# The whole computation in one ATen call: SDPA and the kernels it dispatches to
FUSED_ATEN = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
              "_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention")
NN_MODULES = ("MultiheadAttention", "CausalSelfAttention")
SUITE_GOAL = 1.0


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


# ---------------------------------------------------------------------------------------
# The model-shape suite
# ---------------------------------------------------------------------------------------

MODEL_SHAPES = (
    Shape("gpt2-small-train", "GPT-2 small", GPT2 + " (768 = 12 heads x 64)",
          dict(B=8, H=12, N=1024, D=64), train("causal")),
    Shape("gpt2-medium-train", "GPT-2 medium", GPT2 + " (1024 = 16 heads x 64)",
          dict(B=4, H=16, N=1024, D=64), train("causal")),
    Shape("llama2-7b-train", "Llama 2 7B", LLAMA2 + "; 4096 = 32 heads x 128, one 4096-token "
          "sequence per micro-batch", dict(B=1, H=32, N=4096, D=128), train("causal")),
    Shape("llama2-7b-prefill", "Llama 2 7B", LLAMA2 + "; inference: a 1000-token prompt (N no "
          "power of two)", dict(B=1, H=32, N=1000, D=128), infer("causal")),
    Shape("bert-base-train", "BERT-base", BERT + "; fine-tuning batch 32 at 512, bidirectional",
          dict(B=32, H=12, N=512, D=64), train("full")),
    Shape("vit-b16-train", "ViT-B/16", VIT + "; batch 64, bidirectional",
          dict(B=64, H=12, N=197, D=64), train("full")),
    Shape("whisper-base-encoder", "Whisper base", WHISPER + "; inference batch 8",
          dict(B=8, H=8, N=1500, D=64), infer("full")),
    Shape("clip-text-inference", "CLIP text", CLIP + "; a batch of 128 prompts",
          dict(B=128, H=8, N=77, D=64), infer("causal")),
)


def tiny_twin(s):
    # D 64 -> 16 and 128 -> 32: both stay head dimensions Level 4 supports (16..128)
    return dict(B=min(s["B"], 2), H=min(s["H"], 2), N=shrink(s["N"], 32, low=3),
                D=max(16, s["D"] // 4))


def describe(s, variants):
    return f"B{s['B']} H{s['H']} N{s['N']} D{s['D']}" + (" causal" if "causal" in variants else "")


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from ..calls import Impl

    def prepare(args):
        q, k, v = args["q"], args["k"], args["v"]

        def call():
            return [scaled_dot_product_attention(q, k, v, is_causal=args["causal"],
                                                 scale=args["scale"])]
        return call, [q, k, v]

    label = f"SDPA {backend.name}" if backend is not None else "SDPA (PyTorch's choice)"
    context = (lambda: sdpa_kernel(backend)) if backend is not None else contextlib.nullcontext
    return Impl(label, "library", prepare, context)


def libraries(device, dtype):
    """SDPA with each fused backend pinned: each is timed where it runs, the fastest is the
    baseline."""
    from torch.nn.attention import SDPBackend

    return [_sdpa(b) for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                               SDPBackend.CUDNN_ATTENTION)]


def eager(device, dtype):
    return _sdpa(None)  # SDPA left to choose its own kernel


def host_probe(rec, device) -> None:
    """A whole small call against SDPA's (equivalence/commands/host_probe.py; the recorder
    `rec` is described in cards/layer_norm.py), measured beside layer_norm's backward:
    group "layer_norm_bwd" of the recorded reports/h100-host-probe.json."""
    import torch.nn.functional as F

    import levels.triton as L4

    q = torch.randn(1, 2, 37, 16, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        rec.host("attn eager sdpa no_grad",
                 lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
        rec.host("attn L4 no_grad", lambda: L4.attention(q, q, q, True))


# What `levels explain --level triton` quotes about that call (no piece-by-piece layout).
HOST_PROBE = {"measure": {"layer_norm_bwd": host_probe},
              "recorded": {"group": "layer_norm_bwd", "level4": "attn L4 no_grad",
                           "library": "attn eager sdpa no_grad", "library_name": "SDPA's",
                           "call": "causal, q = k = v (1, 2, 37, 16) bfloat16, under no_grad"}}
