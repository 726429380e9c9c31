"""Level 1 — native PyTorch: idiomatic, vectorized tensor code.

What it adds (over a Python loop): whole-tensor operations. A batched matmul hands the
arithmetic to cuBLAS (GPU) or oneDNN/MKL (CPU); a convolution goes to cuDNN; broadcasting
replaces loops. That already gets the heavy FLOPs onto tuned library kernels.

What it costs: every op is a separate kernel launch, and every intermediate makes a full
round trip through memory. LayerNorm here reads and writes `x`-sized tensors about six
times; attention materializes the whole (Nq x Nk) score matrix, twice (scores and
probabilities); the LSTM launches ~10 kernels per time step. Levels 2-5 remove exactly
these round trips and launches.

Statistics (mean, variance) are computed in float32 even for 16-bit inputs, as real
models do: a bfloat16 sum over 4096 elements would lose ~3 significant digits.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .contract import (autocasts, validate_attention, validate_conv_bn, validate_layer_norm,
                       validate_lstm, validate_mlp, validate_newton_schulz, validate_rms_norm,
                       validate_rope, validate_swiglu_mlp)


def unavailable_reason(device: torch.device, component: str | None = None) -> str | None:
    return None  # runs wherever torch runs


def cublas_tf32() -> bool:
    return torch.backends.cuda.matmul.allow_tf32


def cudnn_tf32() -> bool:
    return torch.backends.cudnn.allow_tf32  # cuDNN convolutions default to TF32


_TF32_SWITCH: dict = {}  # component -> the torch switch its math's library calls obey


def tf32_via(switch):
    """Decorator of a component's `<component>_math`: the library calls it makes (cuBLAS
    matmuls: `cublas_tf32`; cuDNN convolutions: `cudnn_tf32`) run float32 in TF32 where that
    switch of torch's says so. What a component's math calls is said beside that math, so a
    component added later marks its own function and edits nothing shared."""
    def mark(fn):
        _TF32_SWITCH[fn.__name__.removesuffix("_math")] = switch
        return fn
    return mark


def uses_tf32(component: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether fp32 math runs in TF32: only the library GEMMs and convolutions can, and they
    follow torch's switches (Levels 2 and 3 make the same library calls, and share this).
    Math without a `tf32_via` mark is pointwise work and reductions only."""
    if torch.device(device).type != "cuda" or dtype != torch.float32:
        return False
    switch = _TF32_SWITCH.get(component)
    return switch is not None and switch()


# Each component is its contract function (validate, then compute) over a plain math
# function. The math is public because Level 3 compiles exactly this code.

def gemm_operand(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy of it where a GPU library GEMM would refuse its strides.

    cuBLAS takes a matrix's row stride (its "leading dimension") as a 32-bit int: a view
    whose rows lie 2**31 or more elements apart (a slice of a huge buffer) makes torch.matmul
    on a GPU fail inside cuBLAS ("ldb must be ... less than 2147483647"), where the CPU
    computes it. Copying costs the view's elements, not its span; ordinary tensors pass
    through untouched. (Levels 4 and 5 decide for themselves: their kernels index with
    offsets they chose the width of.) Scriptable: Level 2 calls it too."""
    if t.is_cuda:
        for stride in t.stride():
            if stride >= 2147483647:
                return t.contiguous()
    return t


@autocasts("attention")
def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    s = validate_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    return attention_math(q, k, v, causal, s["scale"], s["bottom_right"], kv_lens, s["rope_cos"],
                          s["rope_sin"], s["rope_interleaved"], s["rope_offset"])


def attention_visible(Nq: int, Nk: int, causal: bool, bottom_right: bool,
                      kv_lens: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    """Which keys each query sees: a bool (B or 1, 1, 1, Nq, Nk) mask (None: every key).
    Query i sees key j if j < L (L = kv_lens[b] clipped to [0, Nk], else Nk) and, when
    causal, j <= i (top-left) or j <= i + L - Nq (bottom-right). Scriptable (Level 2)."""
    if not causal and kv_lens is None:
        return None
    j = torch.arange(Nk, device=device).view(1, 1, 1, 1, Nk)
    i = torch.arange(Nq, device=device).view(1, 1, 1, Nq, 1)
    if kv_lens is None:
        lens = torch.full((1, 1, 1, 1, 1), Nk, dtype=torch.long, device=device)
    else:
        lens = kv_lens.to(torch.long).clamp(0, Nk).view(-1, 1, 1, 1, 1)
    visible = j < lens
    if causal:
        shift = lens - Nq if bottom_right else torch.zeros_like(lens)
        visible = visible & (j <= i + shift)
    return visible


def attention_rope(q, k, cos, sin, interleaved: bool, offset: int):
    """attention's rope=: q and k rotated by rope_math, keys at positions 0..Nk-1 and queries
    at offset..offset+Nq-1 (rows of the tables). Unfused: two rotated copies of q and k go
    through memory before the scores; Levels 4 and 5 rotate tiles in registers instead."""
    Nq, Nk = q.shape[2], k.shape[2]
    q = rope_math(q, cos[offset:offset + Nq], sin[offset:offset + Nq], interleaved)
    k = rope_math(k, cos[:Nk], sin[:Nk], interleaved)
    return q, k


@tf32_via(cublas_tf32)
def attention_math(q, k, v, causal: bool, scale: float, bottom_right: bool = False,
                   kv_lens: Optional[torch.Tensor] = None, rope_cos: Optional[torch.Tensor] = None,
                   rope_sin: Optional[torch.Tensor] = None, rope_interleaved: bool = False,
                   rope_offset: int = 0):
    # The textbook definition, on purpose: softmax(q k^T * scale) v with the full score
    # matrix in memory. (torch's scaled_dot_product_attention would hide the flash kernel
    # that Level 4 builds by hand.)
    if rope_cos is not None and rope_sin is not None:
        q, k = attention_rope(q, k, rope_cos, rope_sin, rope_interleaved, rope_offset)
    q, k, v = gemm_operand(q), gemm_operand(k), gemm_operand(v)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    visible = attention_visible(Nq, Nk, causal, bottom_right, kv_lens, q.device)
    if Hkv != H:
        # Grouped-query attention without copying K and V: the H query heads viewed as
        # (H_kv, group), each group's matmul broadcasting its one K/V head.
        q, k, v = q.reshape(B, Hkv, H // Hkv, Nq, D), k.unsqueeze(2), v.unsqueeze(2)
    elif visible is not None:
        visible = visible.squeeze(2)  # (B or 1, 1, Nq, Nk): the 4-D scores' mask
    # Only lengths or a bottom-right diagonal above some queries leave a query no key at all.
    may_be_empty = kv_lens is not None or (causal and bottom_right and Nq > Nk)
    ### BEGIN SOLUTION
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if visible is not None and may_be_empty:
        # A query that sees no key gets an output of 0 (as SDPA). Its row keeps every score
        # unmasked, so its softmax stays finite (no 0/0) and its zeroed probabilities send
        # back zero gradients.
        seen = visible.any(-1, keepdim=True)
        scores = scores.masked_fill(~(visible | ~seen), float("-inf"))
        probs = torch.softmax(scores, dim=-1).masked_fill(~seen, 0.0)
    elif visible is not None:
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).reshape(B, H, Nq, D)
    ### END SOLUTION


@autocasts("layer_norm")
def layer_norm(x, weight, bias, eps=1e-5):
    validate_layer_norm(x, weight, bias, eps)
    return layer_norm_math(x, weight, bias, float(eps))


def layer_norm_math(x, weight, bias, eps: float):
    # Written out op by op (F.layer_norm is already a hand-fused kernel, the thing
    # Levels 3-5 rebuild). Each line below is one kernel and one pass over memory.
    ### BEGIN SOLUTION
    x32 = x.float()
    mean = x32.mean(dim=-1, keepdim=True)
    centered = x32 - mean
    var = (centered * centered).mean(dim=-1, keepdim=True)
    y = centered * torch.rsqrt(var + eps)
    return (y * weight.float() + bias.float()).to(x.dtype)
    ### END SOLUTION


@autocasts("rms_norm")
def rms_norm(x, weight, eps=1e-6):
    validate_rms_norm(x, weight, eps)
    return rms_norm_math(x, weight, float(eps))


def rms_norm_math(x, weight, eps: float):
    # LayerNorm without the mean: no centring, no bias (Zhang & Sennrich 2019, the norm of
    # Llama, Mistral, Qwen). One reduction a row instead of two; still four passes here.
    ### BEGIN SOLUTION
    x32 = x.float()
    ms = (x32 * x32).mean(dim=-1, keepdim=True)
    y = x32 * torch.rsqrt(ms + eps)
    return (y * weight.float()).to(x.dtype)
    ### END SOLUTION


@autocasts("mlp")
def mlp(x, w1, b1, w2, b2):
    validate_mlp(x, w1, b1, w2, b2)
    return mlp_math(x, w1, b1, w2, b2)


@tf32_via(cublas_tf32)
def mlp_math(x, w1, b1, w2, b2):
    ### BEGIN SOLUTION
    hidden = F.linear(gemm_operand(x), w1, b1)  # GEMM with the bias folded in (addmm)
    hidden = F.gelu(hidden)  # exact erf GELU: one more read+write of the widest tensor
    return F.linear(hidden, w2, b2)
    ### END SOLUTION


@autocasts("swiglu_mlp")
def swiglu_mlp(x, w_gate, w_up, w_down):
    validate_swiglu_mlp(x, w_gate, w_up, w_down)
    return swiglu_mlp_math(x, w_gate, w_up, w_down)


@tf32_via(cublas_tf32)
def swiglu_mlp_math(x, w_gate, w_up, w_down):
    # Llama's MLP as its reference code writes it: three cuBLAS GEMMs (no biases), then
    # SiLU and the product as two more kernels, each a full pass over an (M, hidden)
    # tensor: silu reads G and writes it back, the product reads both and writes A.
    x = gemm_operand(x)
    ### BEGIN SOLUTION
    gate = F.linear(x, w_gate)
    up = F.linear(x, w_up)
    return F.linear(F.silu(gate) * up, w_down)
    ### END SOLUTION


@autocasts("lstm")
def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return lstm_math(x, h0, c0, w_ih, w_hh, b_ih, b_hh)


@tf32_via(cublas_tf32)
def lstm_math(x, h0, c0, w_ih, w_hh, b_ih, b_hh, steps=None):
    # The input projection does not depend on h, so all T steps share one big GEMM
    # (B*T rows) before the loop; only h @ W_hh^T must stay inside it.
    # `steps`: what runs the time loop (default lstm_steps; Level 3 passes its compiled
    # one, a few steps per graph: see levels/compiled.py).
    x_proj = F.linear(x, w_ih, b_ih)  # (B, T, 4H)
    out, h, c = (steps or lstm_steps)(x_proj, b_hh, h0, c0, w_hh)
    return out, (h, c)


def lstm_steps(x_proj, b_hh, h0, c0, w_hh):
    """The time loop from states h0, c0 of shape (1, B, H); returns (out, h, c), the states
    in that shape again. (Returning h and c themselves, which the loop also reads, from a
    graph compiled for meta tensors breaks Inductor 2.13's meta pass: it replaces graph
    outputs by empty tensors placed after their users. Views of them are safe.)"""
    # b_hh is added in the loop (as nn.LSTM's equations write it), not folded into the
    # projection's bias as b_ih + b_hh: a compiled graph hands a sum's two inputs one
    # gradient tensor, and two parameters whose .grad is the same memory are scaled twice by
    # clip_grad_norm_ (found by `levels train`). Inductor fuses the add into the gate math.
    h, c = h0[0], c0[0]
    outputs = []
    for t in range(x_proj.shape[1]):
        ### BEGIN SOLUTION
        gates = x_proj[:, t] + b_hh + h @ w_hh.t()
        i, f, g, o = gates.chunk(4, dim=-1)  # nn.LSTM's gate order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ### END SOLUTION
        outputs.append(h)
    return torch.stack(outputs, dim=1), h.unsqueeze(0), c.unsqueeze(0)


@autocasts("conv_bn")
def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    s = validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                         stride, padding, eps, momentum, training)
    return conv_bn_math(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                        s["stride"], s["padding"], float(eps), float(momentum), training)


@tf32_via(cudnn_tf32)
def conv_bn_math(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                 stride, padding, eps: float, momentum: float, training: bool):
    y = F.conv2d(x, conv_weight, conv_bias, stride=stride, padding=padding)
    if y.shape[0] == 0:
        return conv_bn_no_images(y, bn_weight, bn_bias)
    y32 = y.float()
    ### BEGIN SOLUTION
    if training:
        mean = y32.mean(dim=(0, 2, 3))
        var = y32.var(dim=(0, 2, 3), unbiased=False)  # normalize with the biased variance...
        with torch.no_grad():
            n = y32.numel() // y32.shape[1]
            # ...but track the unbiased one, exactly as BatchNorm2d does.
            running_mean.mul_(1 - momentum).add_((momentum * mean).to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_((momentum * var * n / (n - 1)).to(running_var.dtype))
    else:
        mean, var = running_mean.float(), running_var.float()
    scale = bn_weight.float() * torch.rsqrt(var + eps)
    shift = bn_bias.float() - mean * scale
    return (y32 * scale[None, :, None, None] + shift[None, :, None, None]).to(x.dtype)
    ### END SOLUTION


def conv_bn_no_images(y, bn_weight, bn_bias):
    """conv_bn of a batch of 0 images, in either mode, from the convolution's (empty) output:
    there are no statistics to normalize with or to track, and torch's batch_norm returns
    before it computes or updates any (running_mean and running_var stay as they are). The
    parameters still enter the graph, so their gradients are zeros, as torch's, not None."""
    shape = [1, -1, 1, 1]
    out = y.float() * bn_weight.float().reshape(shape) + bn_bias.float().reshape(shape)
    return out.to(y.dtype)


@autocasts("rope")
def rope(x, cos, sin, interleaved=False):
    validate_rope(x, cos, sin, interleaved)
    return rope_math(x, cos, sin, interleaved)


def rope_math(x, cos, sin, interleaved: bool):
    # Each pair (x1, x2) of features is a point in the plane, turned by its position's angle:
    # (x1 cos - x2 sin, x2 cos + x1 sin). Op by op this reads x twice (the two halves), writes
    # four (B, H, N, D/2) temporaries and copies them back together: about 5x the bytes of the
    # one read and one write a fused kernel needs. No backward to write: autograd derives
    # it, and it is the rotation by -angle (Levels 4 and 5 write that themselves).
    half = x.shape[-1] // 2
    x32 = x.float()
    if interleaved:  # pairs (2i, 2i + 1), the RoPE paper's and Meta's Llama
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
    else:  # pairs (i, i + D/2), GPT-NeoX's and HF Llama's "rotate_half"
        x1, x2 = x32[..., :half], x32[..., half:]
    ### BEGIN SOLUTION
    c, s = cos.float(), sin.float()  # (N, D/2): broadcast over batch and heads
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    ### END SOLUTION
    if interleaved:
        y = torch.stack((y1, y2), dim=-1).flatten(-2)
    else:
        y = torch.cat((y1, y2), dim=-1)
    return y.to(x.dtype)


@autocasts("newton_schulz")
def newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    s = validate_newton_schulz(G, steps, coefficients, eps)
    if G.numel() == 0:  # an empty batch: nothing to launch
        return torch.empty(G.shape, dtype=G.dtype, device=G.device)
    return newton_schulz_math(G, s["steps"], s["a"], s["b"], s["c"], s["eps"])


@tf32_via(cublas_tf32)
def newton_schulz_math(G, steps: int, a: float, b: float, c: float, eps: float):
    # Muon's orthogonalization (Jordan et al. 2024) as its reference code writes it: per
    # step three cuBLAS GEMMs (X X^T, A A, B X) and three pointwise kernels (b*A, the add
    # of c*A^2, a*X + ...), each a round trip of an (m, m) or (m, n) matrix through
    # memory. cuBLAS computes all of X X^T although it is symmetric: half its FLOPs
    # compute the mirror image of the other half (Levels 4 and 5 compute one triangle).
    # G may be a batch (B, m, n): the same code, every matmul a batched one (one cuBLAS
    # strided-batched GEMM for all B matrices: one launch where a loop over a parameter
    # list makes B), every norm per matrix (over the last two dimensions).
    tall = G.shape[-2] > G.shape[-1]
    X = G.mT if tall else G  # rows <= cols: A = X X^T is the smaller Gram matrix
    ### BEGIN SOLUTION
    # the norm in float32 (a 16-bit sum of millions of squares loses its digits)
    norm = torch.linalg.vector_norm(X.float(), dim=(-2, -1), keepdim=True)
    X = (X.float() / (norm + eps)).to(G.dtype)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    ### END SOLUTION
    return X.mT if tall else X
