"""Rotary position embeddings: each feature pair of x (B, H, N, D) turned by its position's
angle, cos and sin (N, D/2) given as tables. Pairs (i, i + D/2) by default (GPT-NeoX, HF
Llama), (2i, 2i + 1) with interleaved=True (the RoPE paper, Meta's Llama). Differentiable in
x only: cos and sin are tables (built from positions, never trained), and the contract
refuses tables that require grad."""

import math

import torch

from . import LLAMA2, Shape, as_view, nbytes, randn, shrink, train, uniform

SIZES = {
    "tiny": dict(B=2, H=3, N=37, D=20),  # N no block multiple, D/2 = 10 no power of two
    "small": dict(B=2, H=8, N=512, D=64),
    "bench": dict(B=4, H=32, N=4096, D=128),
}
VARIANTS = {"half": dict(interleaved=False), "interleaved": dict(interleaved=True)}
OUTPUTS = ("out",)
DIFFERENTIABLE = ("x",)
MUTATED: dict = {}
SCALING_DIM = "N"  # the sequence
GRAPH_INPUTS = ("x",)  # the tables are a layer's buffers (levels.nn.RotaryEmbedding)
RATE = "TB/s"  # four multiplies a pair: it moves bytes
# No ATen op computes RoPE in one call; a kernel level that dispatched these pointwise ops
# would be Level 1 again, which the grader's launch count shows anyway.
FUSED_ATEN: tuple = ()
NN_MODULES = ("RotaryEmbedding",)
# At least the eager formula's speed in the suite (a fused kernel moves ~1/3 of its bytes);
# the real goal, >= 0.9x a device copy's bandwidth, is the bench's (commands/bench/rope.py).
SUITE_GOAL = 1.0
# Level 5's answer is the rotation, rope.cuh's rope_rotate (Level 4's rotate_pairs): rope.cu,
# the kernels that load, call it and store, is the file the grader compiles.
SOLUTION_FILES = {"cuda": ("cuda_kernels/rope.cuh", "cuda_kernels/rope.cu")}


def strided(args):
    """x as q cut out of a fused qkv projection: a (B, N, 3, H, D) buffer viewed as
    (B, H, N, D), no unit stride but D's, k and v between its elements; the tables as rows
    sliced out of wider buffers (a cache of cos and sin for a longer context, say)."""
    x = args["x"]
    B, H, N, D = x.shape
    packed = torch.full((B, N, 3, H, D), float("nan"), dtype=x.dtype, device=x.device)
    args["x"] = packed[:, :, 0].transpose(1, 2).copy_(x)
    for name in ("cos", "sin"):
        args[name] = as_view(args[name], "row_padded")
    return args


def make_args(shape, dtype, device, generator):
    B, H, N, D = shape["B"], shape["H"], shape["N"], shape["D"]
    # Random angles, not 0..N-1 times the frequencies: every pair turned by an arbitrary
    # angle (position 0's angle is 0, where a swapped cos and sin would go unnoticed).
    theta = uniform((N, D // 2), generator, torch.float32, "cpu", -math.pi, math.pi)
    return dict(x=randn((B, H, N, D), generator, dtype, device),
                cos=torch.cos(theta).to(device=device, dtype=dtype),
                sin=torch.sin(theta).to(device=device, dtype=dtype),
                interleaved=False)


def reference(x, cos, sin, interleaved=False):
    # Written as complex multiplication, independently of the levels' real arithmetic: a
    # pair is the complex number x1 + i x2, the rotation multiplies it by cos + i sin.
    D = x.shape[-1]
    if interleaved:
        pairs = x.reshape(*x.shape[:-1], D // 2, 2)
        z = torch.complex(pairs[..., 0].contiguous(), pairs[..., 1].contiguous())
    else:
        z = torch.complex(x[..., :D // 2].contiguous(), x[..., D // 2:].contiguous())
    turned = z * torch.complex(cos, sin)
    parts = (turned.real, turned.imag)
    out = torch.stack(parts, dim=-1).flatten(-2) if interleaved else torch.cat(parts, dim=-1)
    return (out,)


def flops(args):
    n = args["x"].numel()
    return {"fwd": 3 * n, "bwd": 3 * n}  # per pair: 4 multiplies, 2 adds


def min_bytes(args):
    x, cos, sin = args["x"], args["cos"], args["sin"]
    # forward: read x, write y; backward: read dy, write dx (the tables once each way)
    return {"fwd": 2 * nbytes(x) + nbytes(cos, sin), "bwd": 2 * nbytes(x) + nbytes(cos, sin)}


# ---------------------------------------------------------------------------------------
# The model-shape suite: q and k of one attention layer, rotated
# ---------------------------------------------------------------------------------------

LLAMA3 = ("Llama 3 8B (Dubey et al. 2024; HF meta-llama/Meta-Llama-3-8B config.json: "
          "hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000)")
MISTRAL = ("Mistral 7B (Jiang et al. 2023; HF mistralai/Mistral-7B-v0.1 config.json: "
           "hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim 128)")
QWEN2 = ("Qwen2 7B (Yang et al. 2024; HF Qwen/Qwen2-7B config.json: hidden_size=3584, "
         "num_attention_heads=28, num_key_value_heads=4: head_dim 128, rope_theta=1000000)")
NEOX = ("GPT-NeoX-20B (Black et al. 2022; HF EleutherAI/gpt-neox-20b config.json: "
        "hidden_size=6144, num_attention_heads=64: head_dim 96, rotary_pct=0.25, so 24 "
        "rotated features a head: here D = 96 rotated whole, the layout at its head size)")

MODEL_SHAPES = (
    Shape("llama2-7b-q-train", "Llama 2 7B", LLAMA2 + "; q (or k) of one layer: 32 heads x "
          "128, one 4096-token sequence, half-split (HF)", dict(B=1, H=32, N=4096, D=128),
          train("half")),
    Shape("llama2-7b-q-meta", "Llama 2 7B", LLAMA2 + "; the same q in Meta's interleaved "
          "layout (llama/model.py's view_as_complex)", dict(B=1, H=32, N=4096, D=128),
          train("interleaved")),
    Shape("llama3-8b-k-train", "Llama 3 8B", LLAMA3 + "; k: 8 key/value heads x 128, 8192 "
          "tokens", dict(B=1, H=8, N=8192, D=128), train("half")),
    Shape("llama3-8b-q-prefill", "Llama 3 8B", LLAMA3 + "; q of a 1000-token prompt (N no "
          "power of two), inference", dict(B=1, H=32, N=1000, D=128), (("half", "fwd"),)),
    Shape("mistral-7b-q-train", "Mistral 7B", MISTRAL + "; q, batch 2 x 4096 tokens",
          dict(B=2, H=32, N=4096, D=128), train("half")),
    Shape("qwen2-7b-q-train", "Qwen2 7B", QWEN2 + "; q, 28 heads, 4096 tokens",
          dict(B=1, H=28, N=4096, D=128), train("half")),
    Shape("gpt-neox-20b-q-train", "GPT-NeoX 20B", NEOX + "; q, 2048 tokens",
          dict(B=1, H=64, N=2048, D=96), train("half")),
)


def tiny_twin(s):
    return dict(B=min(s["B"], 2), H=min(s["H"], 2), N=shrink(s["N"], 64, low=3),
                D=max(8, s["D"] // 8))


def describe(s, variants):
    return f"B{s['B']} H{s['H']} N{s['N']} D{s['D']}" + (" interleaved" if "interleaved" in
                                                          variants else "")


def libraries(device, dtype):
    """The eager formula (HF transformers' apply_rotary_pos_emb, or Meta's pair layout):
    torch has no fused RoPE op, so the baseline is what a model's code does, op by op."""
    from ..calls import Impl

    def prepare(args):
        x, cos, sin, interleaved = args["x"], args["cos"], args["sin"], args["interleaved"]
        half = x.shape[-1] // 2
        if interleaved:
            def call():
                x1, x2 = x[..., 0::2], x[..., 1::2]
                return [torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)]
        else:
            cos2, sin2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # HF's (N, D)

            def call():
                rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # rotate_half
                return [x * cos2 + rotated * sin2]
        return call, [x]  # what is differentiated: x (cos and sin are tables)

    return [Impl("eager formula", "library", prepare)]
