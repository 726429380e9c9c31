"""Attention: softmax(q k^T * scale) v, optionally causal; grouped-query (k, v with H_kv heads
dividing q's H), causal with Nq != Nk in either alignment, per-batch key lengths, rotary
position embeddings of q and k fused in (rope=)."""

import contextlib
import math

import torch

from . import (BERT, CLIP, GPT2, LLAMA2, VIT, WHISPER, Shape, as_view, infer, nbytes, randn, shrink,
               train, uniform)
from . import rope as rope_card

SIZES = {
    "tiny": dict(B=1, H=2, N=37, D=16),  # N not a multiple of any block size
    "small": dict(B=2, H=4, N=256, D=64),
    "bench": dict(B=4, H=16, N=4096, D=128),
}
VARIANTS = {"full": dict(causal=False), "causal": dict(causal=True),
            # grouped-query attention, more keys than queries, a head size no power of two
            # (16 -> 24, 64 -> 96, 128 -> 192: padded inside the kernels), causal top-left
            "gqa": dict(causal=True, causal_alignment="top_left"),
            # decoding/prefill against a KV cache: few queries, multi-query attention (one
            # K/V head), per-batch key lengths, the causal diagonal at the bottom right
            "decode": dict(causal=True, causal_alignment="bottom_right"),
            # rope=(cos, sin, False) fused: HF Llama's half-split pairs, grouped K/V heads, a
            # chunk of queries after a cache of keys (bottom-right: the queries' positions
            # start at Nk - Nq), tables longer than the call needs. (One variant: each costs
            # every level's generic tests a case, Level 3 a compile; Meta's interleaved pairs
            # are tests/test_attention_rope.py's.)
            "rope": dict(causal=True, causal_alignment="bottom_right")}
# What each variant changes in a preset's shape (make_args reads these keys).
VARIANT_SHAPES = {"gqa": dict(kv_group=2, nk_extra=True, odd_head=True),
                  # two sequences at least: the second's length leaves queries with no key
                  "decode": dict(kv_group="all", nq_short=True, kv_lens=True, min_batch=2),
                  "rope": dict(rope="half", kv_group=2, nq_short=True)}
ROPE_SPARE = 3  # positions the tables hold past the last one a call uses
OUTPUTS = ("out",)
# Level 5's regions are all in attention.cu; attention_backward.cu compiles its backward's
# kernels (a unit of its own, for the build's time), so the grader compiles both.
SOLUTION_FILES = {"cuda": ("cuda_kernels/attention.cu", "cuda_kernels/attention_backward.cu")}
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
    B, H, Nq, D = q.shape
    group = H // k.shape[1]  # grouped-query attention: K/V head h // group serves query head h
    kh, vh = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    dp = (upstream[0] * vh).sum(-1, keepdim=True)  # (B, H, Nq, 1)
    per_query_head = scale * (dp * q).sum(2, keepdim=True)  # (B, H, 1, D)
    return {"q": scale * dp * kh,
            "k": per_query_head.reshape(B, k.shape[1], group, 1, D).sum(2)}


def strided(args):
    """q, k and v cut out of one packed projection, as a fused qkv Linear produces them:
    a (B, N, H + 2 H_kv, D) buffer viewed as three (B, heads, N, D) tensors (no dimension has
    unit stride but D, and q, k, v interleave in memory). Where q has another length than
    k and v (decoding), q comes from its own (B, Nq, H, D) projection, k and v from a packed
    (B, Nk, 2 H_kv, D) one."""
    q, k = args["q"], args["k"]
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    heads = {"q": H, "k": Hkv, "v": Hkv}
    names = ("q", "k", "v") if Nq == Nk else ("k", "v")
    packed = torch.empty((B, Nk, sum(heads[n] for n in names), D), dtype=q.dtype, device=q.device)
    start = 0
    for name in names:
        args[name] = packed[:, :, start:start + heads[name]].transpose(1, 2).copy_(args[name])
        start += heads[name]
    if Nq != Nk:
        own = torch.empty((B, Nq, H, D), dtype=q.dtype, device=q.device)
        args["q"] = own.transpose(1, 2).copy_(q)
    if args.get("rope") is not None:
        # the tables as rows of wider buffers (NaN between the rows): a slice of a cache of
        # cos and sin precomputed for a longer context, as models keep them
        cos, sin, *flag = args["rope"]
        args["rope"] = (as_view(cos, "row_padded"), as_view(sin, "row_padded"), *flag)
    if args.get("kv_lens") is not None:
        # every other element of a buffer whose gaps hold -7 (a length that would mask every
        # key: a kernel reading between the elements computes something else)
        lens = args["kv_lens"]
        args["kv_lens"] = torch.full((2 * lens.numel(),), -7, dtype=lens.dtype,
                                     device=lens.device)[::2].copy_(lens)
    return args


def make_args(shape, dtype, device, generator):
    B, H, N, D = max(shape["B"], shape.get("min_batch", 1)), shape["H"], shape["N"], shape["D"]
    group = H if shape.get("kv_group") == "all" else shape.get("kv_group", 1)
    Nq = max(1, N // 8) + 1 if shape.get("nq_short") else N
    Nk = N + N // 3 if shape.get("nk_extra") else N
    D = D * 3 // 2 if shape.get("odd_head") else D
    args = dict(q=randn((B, H, Nq, D), generator, dtype, device),
                k=randn((B, H // group, Nk, D), generator, dtype, device),
                v=randn((B, H // group, Nk, D), generator, dtype, device),
                causal=False, scale=None)
    # (causal_alignment comes with the variants that use it, and kv_lens with the shapes that
    # ask for it: a function written for (q, k, v, causal, scale) still runs the others)
    if shape.get("kv_lens"):
        # lengths between a third of the keys and all of them; the last element of a batch
        # of several gets the fewest, so that some of its queries see no key at all
        lens = torch.randint(Nk // 3, Nk + 1, (B,), generator=generator)
        if B > 1:
            lens[-1] = max(0, Nq // 2 - 1)
        args["kv_lens"] = lens.to(device)
    if shape.get("rope"):
        # Random angles (as the rope card draws them: position 0's angle is 0 in a real table,
        # where swapped cos and sin would go unnoticed), ROPE_SPARE more positions than used
        theta = uniform((Nk + ROPE_SPARE, D // 2), generator, torch.float32, "cpu", -math.pi,
                        math.pi)
        args["rope"] = (torch.cos(theta).to(device=device, dtype=dtype),
                        torch.sin(theta).to(device=device, dtype=dtype),
                        shape["rope"] == "interleaved")
    return args


def visible(Nq, Nk, causal, causal_alignment, kv_lens, B):
    """(B, Nq, Nk) bool: which key each query sees, from the definition, one element at a
    time (independent of the levels' vectorized masks)."""
    out = torch.zeros((B, Nq, Nk), dtype=torch.bool)
    for b in range(B):
        L = Nk if kv_lens is None else min(max(int(kv_lens[b]), 0), Nk)
        shift = L - Nq if causal_alignment == "bottom_right" else 0
        for i in range(Nq):
            last = min(L, i + shift + 1) if causal else L
            out[b, i, :max(last, 0)] = True
    return out


def rotated(x, cos, sin, interleaved, first):
    """x (B, H, N, D) turned by the angles of table rows first..first+N-1, in float64: the
    rope card's reference (complex multiplication, independent of the levels' arithmetic)."""
    N = x.shape[2]
    return rope_card.reference(x, cos[first:first + N].to(torch.float64),
                               sin[first:first + N].to(torch.float64), interleaved)[0]


def reference(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if rope is not None:
        cos, sin, *flag = rope
        interleaved = bool(flag[0]) if flag else False
        # keys at positions 0..Nk-1; queries the last Nq of them when bottom-right
        first = Nk - Nq if causal_alignment == "bottom_right" else 0
        q, k = rotated(q, cos, sin, interleaved, first), rotated(k, cos, sin, interleaved, 0)
    # Query head h reads K/V head h // (H / H_kv): index K and V head by head.
    kv = torch.tensor([h // (H // Hkv) for h in range(H)], dtype=torch.long)
    kh, vh = k[:, kv.to(k.device)], v[:, kv.to(v.device)]
    s = torch.einsum("bhid,bhjd->bhij", q, kh) * scale
    seen = visible(Nq, Nk, causal, causal_alignment, kv_lens, B).to(q.device)[:, None]
    s = s.masked_fill(~seen, float("-inf"))
    # A query that sees no key outputs 0 (as SDPA): its row of weights is all zero.
    row_max = s.amax(dim=-1, keepdim=True) if Nk else s.sum(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(s - row_max)
    total = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    return (torch.einsum("bhij,bhjd->bhid", p, vh),)


def flops(args):
    q, k = args["q"], args["k"]
    B, H, Nq, D = q.shape
    fwd = 4 * B * H * Nq * k.shape[2] * D  # two GEMMs: q k^T and p v (every key, as SDPA counts)
    if args.get("causal") and Nq == k.shape[2]:
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
        rope = args.get("rope")

        def call():
            qr, kr = (q, k) if rope is None else _eager_rope(
                q, k, args.get("causal_alignment") == "bottom_right", *rope)
            return [scaled_dot_product_attention(qr, kr, v, is_causal=args["causal"],
                                                 scale=args["scale"])]
        return call, [q, k, v]

    label = f"SDPA {backend.name}" if backend is not None else "SDPA (PyTorch's choice)"
    context = (lambda: sdpa_kernel(backend)) if backend is not None else contextlib.nullcontext
    return Impl(label, "library", prepare, context)


def _eager_rope(q, k, bottom_right, cos, sin, interleaved=False):
    """q and k rotated as a model's own code does before SDPA (HF's apply_rotary_pos_emb, or
    Meta's pairs): the library side of a rope= call, op by op, at rope='s positions."""
    Nq, Nk = q.shape[2], k.shape[2]
    first = Nk - Nq if bottom_right else 0

    def turn(x, c, s):
        if interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * torch.cat((c, c), -1) + rotated * torch.cat((s, s), -1)
    return turn(q, cos[first:first + Nq], sin[first:first + Nq]), turn(k, cos[:Nk], sin[:Nk])


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
