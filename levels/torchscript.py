"""Level 2 — TorchScript: the Level 1 math, compiled to a static graph by `torch.jit.script`.

What it adds over native PyTorch: the whole function becomes one graph that a compiler can
see at once. After a couple of warm-up ("profiling") calls, the graph executor knows the
shapes, dtypes and devices, and its TensorExpr fuser (NNC) merges chains of pointwise ops
into one generated kernel: the erf-GELU after the first GEMM, the LSTM cell's
sigmoid/tanh/mul/add gate math inside the scripted time loop, LayerNorm's subtract /
square / rsqrt / scale / shift, the batch-norm normalization, attention's scale+mask.
Each fused group reads its inputs once and writes its output once, instead of one memory
round trip per op. Autograd works through scripted functions: the executor builds a
`DifferentiableGraph` with a symbolic backward, and fuses that too.

What it costs:
  * A restricted language (types are annotated, no arbitrary Python) and a warm-up
    before the optimized graph exists; new shapes or dtypes re-profile. The profiling
    calls and the optimized graph round differently (the optimized graph is specialized and
    may order operations differently), so the first calls of a shape and later ones can
    differ in the last bits; once settled, the same inputs give the same bits
    (tests/test_determinism.py).
  * Fusion only happens where the fuser has a code generator: CUDA by default. On the CPU
    the fuser needs a PyTorch built with LLVM, which the standard wheels are not, so on a
    CPU this level runs the same ATen kernels as Level 1 through an interpreter
    (`equivalence.explain` shows the graph, and says so).
  * Matmuls, convolutions, reductions and softmax are never fused: they stay library calls.
  * TorchScript is deprecated (since PyTorch 2.5; recent releases warn on every
    `torch.jit.script`). Its
    successors are `torch.compile` (Level 3) for speed and `torch.export` for deployment.
    We show that warning once, explained, and if a torch without scripting ever shows up
    the level reports itself unavailable instead of crashing.

conv_bn in eval mode is where a graph compiler shines for inference: batch norm with
running statistics is an affine map per channel, so it can be *folded into the
convolution's weights and bias*, and BN disappears. `torch.jit.freeze` does exactly that
(its `FoldFrozenConvBatchnorm` pass) — but only for a module whose parameters and buffers
it can turn into constants, and a frozen module has no gradients for them and keeps the
values it was frozen with. The contract here gets fresh tensors on every call and must
return gradients for every one, so the level folds BN into the conv explicitly, in a
scripted (differentiable) function, every call: the same arithmetic freeze performs once.
`frozen_conv_bn` below builds the real frozen module for inference, and `explain` prints
its graph before and after freezing, where batch_norm is gone.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import native
from .contract import (COMPONENTS, autocasts, validate_attention, validate_conv_bn, validate_layer_norm,
                       validate_lstm, validate_mlp, validate_newton_schulz, validate_rms_norm,
                       validate_rope, validate_swiglu_mlp)


class TorchScriptDeprecationWarning(FutureWarning):
    """torch.jit.script is deprecated; Level 2 keeps using it on purpose (shown once).

    A FutureWarning, unlike torch's own DeprecationWarning, is shown by default to
    people running code, not only to people developing it."""


WHY_STILL_USED = ("Level 2 keeps using it on purpose: it is the simplest place to watch a graph "
                  "compiler fuse pointwise ops; its successors are torch.compile (Level 3) and "
                  "torch.export (for deployment).")


# ---------------------------------------------------------------------------------------
# The five components, in the TorchScript subset. These are plain functions until
# `_scripted()` compiles them (lazily: importing this module compiles nothing).
# Every 16-bit input gets its statistics and pointwise chains computed in float32, as in
# Level 1; once the chain is fused on a GPU, those casts happen in registers and are free.
# ---------------------------------------------------------------------------------------

def _attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, bottom_right: bool,
               kv_lens: Optional[Tensor], rope_cos: Optional[Tensor], rope_sin: Optional[Tensor],
               rope_interleaved: bool, rope_offset: int) -> Tensor:
    if rope_cos is not None and rope_sin is not None:
        # rope= as Level 1: q and k rotated (by this level's own scripted _rope) before the
        # scores; the rotation's pointwise group fuses on a GPU, the copies stay
        Nq, Nk = q.size(2), k.size(2)
        q = _rope(q, rope_cos[rope_offset:rope_offset + Nq], rope_sin[rope_offset:rope_offset + Nq],
                  rope_interleaved)
        k = _rope(k, rope_cos[:Nk], rope_sin[:Nk], rope_interleaved)
    q, k, v = native.gemm_operand(q), native.gemm_operand(k), native.gemm_operand(v)
    B, H, Nq, D = q.size(0), q.size(1), q.size(2), q.size(3)
    Hkv, Nk = k.size(1), k.size(2)
    visible = native.attention_visible(Nq, Nk, causal, bottom_right, kv_lens, q.device)
    if Hkv != H:  # grouped-query attention as Level 1: q viewed as (B, H_kv, group, Nq, D)
        q, k, v = q.reshape(B, Hkv, H // Hkv, Nq, D), k.unsqueeze(2), v.unsqueeze(2)
    elif visible is not None:
        visible = visible.squeeze(2)
    may_be_empty = kv_lens is not None or (causal and bottom_right and Nq > Nk)
    ### BEGIN SOLUTION
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if visible is not None:
        # scale and mask are one fused pointwise group; softmax and both matmuls stay library
        # calls. A query that sees no key keeps its scores (a finite softmax), then gets 0.
        if may_be_empty:
            seen = visible.any(-1, keepdim=True)
            scores = scores.masked_fill(~(visible | ~seen), float("-inf"))
            probs = torch.softmax(scores, -1).masked_fill(~seen, 0.0)
        else:
            probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
    else:
        probs = torch.softmax(scores, -1)
    return torch.matmul(probs, v).reshape(B, H, Nq, D)
    ### END SOLUTION


def _layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    ### BEGIN SOLUTION
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True)
    centered = x32 - mean
    var = (centered * centered).mean(-1, keepdim=True)
    # sub, mul, add-eps, rsqrt, mul, mul, add, cast: one fused kernel between the two means.
    y = centered * torch.rsqrt(var + eps) * weight.float() + bias.float()
    return y.to(x.dtype)
    ### END SOLUTION


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    ### BEGIN SOLUTION
    x32 = x.float()
    # mul, mean, add-eps, rsqrt, mul, mul, cast: the fuser joins all but the mean.
    y = x32 * torch.rsqrt((x32 * x32).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)
    ### END SOLUTION


def _mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    # The bias is left out of the first GEMM on purpose, so that bias + GELU form one
    # pointwise chain the fuser can turn into a single kernel. GELU is spelled out
    # (exact erf form, as F.gelu) so that the graph shows every op the fuser merges.
    ### BEGIN SOLUTION
    h = torch.matmul(native.gemm_operand(x), w1.t()).float() + b1.float()
    h = (0.5 * h * (1.0 + torch.erf(h * 0.7071067811865476))).to(x.dtype)
    return torch.matmul(h, w2.t()) + b2
    ### END SOLUTION


def _swiglu_mlp(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    # SiLU spelled out (g * sigmoid(g)) so the graph shows the ops the fuser merges: the
    # sigmoid, the two products and the casts become one kernel between the GEMMs.
    x = native.gemm_operand(x)
    ### BEGIN SOLUTION
    g = torch.matmul(x, w_gate.t()).float()
    u = torch.matmul(x, w_up.t()).float()
    a = (g * torch.sigmoid(g) * u).to(x.dtype)
    return torch.matmul(a, w_down.t())
    ### END SOLUTION


def _lstm(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
          b_hh: Tensor) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
    # As in Level 1, the input projection for all T steps is one GEMM before the loop.
    x_proj = torch.matmul(x, w_ih.t()) + (b_ih + b_hh)
    w_hh_t = w_hh.t()
    h = h0[0]
    c = c0[0]
    outputs: List[Tensor] = []
    # The loop stays a loop in the graph (prim::Loop): no Python runs between steps.
    for t in range(x.size(1)):
        ### BEGIN SOLUTION
        gates = x_proj.select(1, t) + torch.mm(h, w_hh_t)
        i, f, g, o = gates.chunk(4, 1)  # nn.LSTM's gate order
        # Three sigmoids, two tanh, three muls and an add: the classic fused LSTM cell.
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ### END SOLUTION
        outputs.append(h)
    return torch.stack(outputs, 1), (h.unsqueeze(0), c.unsqueeze(0))


def _conv_bn_eval(x: Tensor, conv_weight: Tensor, conv_bias: Optional[Tensor], bn_weight: Tensor,
                  bn_bias: Tensor, running_mean: Tensor, running_var: Tensor, stride: List[int],
                  padding: List[int], eps: float) -> Tensor:
    # BN folded into the conv, as torch.jit.freeze's FoldFrozenConvBatchnorm does:
    #   gamma * (conv(x, W) + b - mean) / sqrt(var + eps) + beta
    #     = conv(x, W * s) + (b - mean) * s + beta,        s = gamma / sqrt(var + eps)
    # One convolution and no normalization pass over the output. Done every call (a few
    # C_out-sized ops and one pass over W) so fresh weights and statistics are always used,
    # and differentiable, so gradients reach conv and BN parameters alike.
    if x.size(0) == 0:
        return native.conv_bn_no_images(torch.conv2d(x, conv_weight, conv_bias, stride, padding),
                                        bn_weight, bn_bias)
    ### BEGIN SOLUTION
    s = bn_weight.float() * torch.rsqrt(running_var.float() + eps)
    w = (conv_weight.float() * s.reshape(-1, 1, 1, 1)).to(conv_weight.dtype)
    shift = bn_bias.float() - running_mean.float() * s
    if conv_bias is not None:
        shift = shift + conv_bias.float() * s
    return torch.conv2d(x, w, shift.to(x.dtype), stride, padding)
    ### END SOLUTION


def _conv_bn_train(x: Tensor, conv_weight: Tensor, conv_bias: Optional[Tensor], bn_weight: Tensor,
                   bn_bias: Tensor, running_mean: Tensor, running_var: Tensor, stride: List[int],
                   padding: List[int], eps: float, momentum: float) -> Tensor:
    # Training mode normalizes with this batch's statistics, which only exist after the
    # conv has run: nothing can be folded. What fuses is the normalization chain.
    y = torch.conv2d(x, conv_weight, conv_bias, stride, padding)
    if y.size(0) == 0:
        return native.conv_bn_no_images(y, bn_weight, bn_bias)
    y32 = y.float()
    ### BEGIN SOLUTION
    mean = y32.mean([0, 2, 3])
    centered = y32 - mean.reshape(1, -1, 1, 1)
    var = (centered * centered).mean([0, 2, 3])  # biased: what the batch is normalized with
    n = y32.numel() // y32.size(1)
    # Running statistics are updated in place, exactly as BatchNorm2d does (unbiased
    # variance, momentum-weighted). detach(): the update is bookkeeping, not part of the
    # function being differentiated.
    running_mean.mul_(1.0 - momentum).add_((mean.detach() * momentum).to(running_mean.dtype))
    running_var.mul_(1.0 - momentum).add_(
        (var.detach() * (momentum * n / (n - 1))).to(running_var.dtype))
    scale = bn_weight.float() * torch.rsqrt(var + eps)
    out = centered * scale.reshape(1, -1, 1, 1) + bn_bias.float().reshape(1, -1, 1, 1)
    return out.to(x.dtype)
    ### END SOLUTION


def _rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    half = x.size(-1) // 2
    x32 = x.float()
    if interleaved:
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
    else:
        x1, x2 = x32[..., :half], x32[..., half:]
    ### BEGIN SOLUTION
    # The four muls, two adds and the casts fuse into one pointwise group on a GPU; the
    # strided slices before and the stack/cat after stay copies of their own.
    c, s = cos.float(), sin.float()
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    ### END SOLUTION
    if interleaved:
        return torch.stack((y1, y2), -1).flatten(-2).to(x.dtype)
    return torch.cat((y1, y2), -1).to(x.dtype)


def _newton_schulz(G: Tensor, steps: int, a: float, b: float, c: float, eps: float) -> Tensor:
    # The same GEMMs as Level 1 (matmuls are never fused); the fuser may join b*A + c*A^2's
    # scale and add, and a*X + B X's, into one pointwise kernel each on a GPU.
    # A batch (B, m, n) is the same code: batched matmuls, per-matrix norms.
    tall = G.shape[-2] > G.shape[-1]
    X = G.transpose(-2, -1) if tall else G
    ### BEGIN SOLUTION
    X32 = X.float()
    norm = torch.linalg.vector_norm(X32, 2.0, [-2, -1], True)
    X = (X32 / (norm + eps)).to(G.dtype)
    for _ in range(steps):
        A = torch.matmul(X, X.transpose(-2, -1))
        B = b * A + c * torch.matmul(A, A)
        X = a * X + torch.matmul(B, X)
    ### END SOLUTION
    return X.transpose(-2, -1) if tall else X


# Found by name: `_<component>` above, or `_<component>_eval` and `_<component>_train` where a
# component scripts one function per mode (conv_bn): a component added later needs no line.
_SOURCES = {name[1:]: globals()[name] for name in
            [f"_{c}{mode}" for c in COMPONENTS for mode in ("", "_eval", "_train")]
            if name in globals()}

# ---------------------------------------------------------------------------------------
# Scripting, once per process, with the deprecation warning shown once.
# ---------------------------------------------------------------------------------------

_lock = threading.Lock()
_SCRIPTED: dict | None = None
_BUILD_ERROR: str | None = None
_WARNED = False


def _warn_deprecated_once(caught: list) -> None:
    """Turn torch's per-call DeprecationWarnings into a single explained warning."""
    global _WARNED
    if _WARNED:
        return
    torch_says = next((str(w.message) for w in caught if "deprecated" in str(w.message).lower()),
                      None)
    if torch_says is None:
        return  # a torch that no longer warns: nothing to explain
    _WARNED = True
    warnings.warn(f"{torch_says} {WHY_STILL_USED}", TorchScriptDeprecationWarning,
                  stacklevel=_stacklevel_outside_levels())


def _stacklevel_outside_levels() -> int:
    """The stacklevel of the first caller outside this package: the warning then points
    at the user's line, not at our internals."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def jit_call(fn, *args, **kwargs):
    """Call a torch.jit API (script, freeze, ...) with its deprecation warning shown only once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    _warn_deprecated_once(caught)
    for w in caught:  # anything that is not the deprecation notice is passed on untouched
        if "deprecated" not in str(w.message).lower():
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


def _scripting_problem() -> str | None:
    """Why this torch cannot script at all (checked before trying), or None."""
    jit = getattr(torch, "jit", None)
    script = getattr(jit, "script", None)
    if not callable(script):
        return ("this PyTorch has no torch.jit.script (TorchScript was deprecated in PyTorch 2.5 "
                "and has been removed); use Level 3 (torch.compile), or torch.export to deploy")
    state = getattr(jit, "_state", None)
    if state is not None and not getattr(state, "_enabled", True):
        # torch.jit.script then returns the Python function unchanged: Level 2 would
        # silently be Level 1, which we never allow.
        return ("TorchScript is disabled in this process (PYTORCH_JIT=0): torch.jit.script is "
                "a no-op")
    return None


def _scripted() -> dict:
    """The scripted functions (compiled on first use), or RuntimeError with the reason."""
    global _SCRIPTED, _BUILD_ERROR
    with _lock:
        if _SCRIPTED is None and _BUILD_ERROR is None:
            problem = _scripting_problem()
            if problem:
                _BUILD_ERROR = problem
            else:
                try:
                    _SCRIPTED = {name: jit_call(torch.jit.script, fn)
                                 for name, fn in _SOURCES.items()}
                except Exception as exc:  # noqa: BLE001 - whatever breaks, the level is unavailable
                    _BUILD_ERROR = (f"torch.jit.script failed on this PyTorch "
                                    f"({type(exc).__name__}: {exc}); TorchScript is deprecated, "
                                    f"use Level 3 (torch.compile)")
    if _BUILD_ERROR is not None:
        raise RuntimeError(f"Level 2 (TorchScript) is unavailable: {_BUILD_ERROR}")
    return _SCRIPTED


def unavailable_reason(device: torch.device, component: str | None = None) -> str | None:
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False)"
    try:
        _scripted()
    except RuntimeError as exc:
        return str(exc)
    return None


uses_tf32 = native.uses_tf32  # the same cuBLAS/cuDNN calls as Level 1


# ---------------------------------------------------------------------------------------
# The contract: validate first (same errors as every level), then run the graph.
# ---------------------------------------------------------------------------------------

@autocasts("attention")
def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    s = validate_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    return _scripted()["attention"](q, k, v, causal, s["scale"], s["bottom_right"], kv_lens,
                                    s["rope_cos"], s["rope_sin"], s["rope_interleaved"],
                                    s["rope_offset"])


@autocasts("layer_norm")
def layer_norm(x, weight, bias, eps=1e-5):
    validate_layer_norm(x, weight, bias, eps)
    return _scripted()["layer_norm"](x, weight, bias, float(eps))


@autocasts("rms_norm")
def rms_norm(x, weight, eps=1e-6):
    validate_rms_norm(x, weight, eps)
    return _scripted()["rms_norm"](x, weight, float(eps))


@autocasts("mlp")
def mlp(x, w1, b1, w2, b2):
    validate_mlp(x, w1, b1, w2, b2)
    return _scripted()["mlp"](x, w1, b1, w2, b2)


@autocasts("swiglu_mlp")
def swiglu_mlp(x, w_gate, w_up, w_down):
    validate_swiglu_mlp(x, w_gate, w_up, w_down)
    return _scripted()["swiglu_mlp"](x, w_gate, w_up, w_down)


@autocasts("lstm")
def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return _scripted()["lstm"](x, h0, c0, w_ih, w_hh, b_ih, b_hh)


@autocasts("conv_bn")
def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    s = validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                         stride, padding, eps, momentum, training)
    stride, padding = list(s["stride"]), list(s["padding"])
    if training:
        return _scripted()["conv_bn_train"](x, conv_weight, conv_bias, bn_weight, bn_bias,
                                            running_mean, running_var, stride, padding,
                                            float(eps), float(momentum))
    return _scripted()["conv_bn_eval"](x, conv_weight, conv_bias, bn_weight, bn_bias,
                                       running_mean, running_var, stride, padding, float(eps))


# ---------------------------------------------------------------------------------------
# Inference deployment the TorchScript way: torch.jit.freeze folds BN into the conv.
# ---------------------------------------------------------------------------------------

def frozen_conv_bn(conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                   stride=1, padding=0, eps=1e-5, *, return_unfrozen=False):
    """A frozen TorchScript module computing eval-mode conv_bn with *these* values.

    Freezing turns parameters and buffers into constants of the graph, and its
    FoldFrozenConvBatchnorm pass folds the batch norm into the convolution (the graph
    ends up with a single aten::conv2d). The price: the module has no gradients for
    those constants and keeps the values it was frozen with — change a running statistic
    afterwards and the frozen module does not notice; freeze again. That is why the
    level itself folds per call instead (see `_conv_bn_eval`).

    With return_unfrozen=True, returns (scripted_before_freezing, frozen) to compare."""
    if not isinstance(conv_weight, torch.Tensor) or conv_weight.dim() != 4:
        got = (f"shape {tuple(conv_weight.shape)}" if isinstance(conv_weight, torch.Tensor)
               else type(conv_weight).__name__)
        raise ValueError("conv_bn: argument 'conv_weight' must be a 4-D tensor "
                         f"(C_out, C_in, kH, kW); got {got}")
    Cout, Cin, kH, kW = conv_weight.shape
    probe = torch.zeros(1, Cin, kH, kW, dtype=conv_weight.dtype, device=conv_weight.device)
    s = validate_conv_bn(probe, conv_weight, conv_bias, bn_weight, bn_bias, running_mean,
                         running_var, stride, padding, eps)
    _scripted()  # the same availability check (and single warning) as the level
    conv = torch.nn.Conv2d(Cin, Cout, (kH, kW), stride=s["stride"], padding=s["padding"],
                           bias=conv_bias is not None, device=conv_weight.device,
                           dtype=conv_weight.dtype)
    bn = torch.nn.BatchNorm2d(Cout, eps=eps, device=conv_weight.device, dtype=conv_weight.dtype)
    with torch.no_grad():
        conv.weight.copy_(conv_weight)
        if conv_bias is not None:
            conv.bias.copy_(conv_bias)
        bn.weight.copy_(bn_weight)
        bn.bias.copy_(bn_bias)
        bn.running_mean.copy_(running_mean)
        bn.running_var.copy_(running_var)
    module = torch.nn.Sequential(conv, bn).eval()  # freeze requires eval mode
    scripted_module = jit_call(torch.jit.script, module)
    frozen = jit_call(torch.jit.freeze, scripted_module)
    return (scripted_module, frozen) if return_unfrozen else frozen


@autocasts("rope")
def rope(x, cos, sin, interleaved=False):
    validate_rope(x, cos, sin, interleaved)
    return _scripted()["rope"](x, cos, sin, interleaved)


@autocasts("newton_schulz")
def newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    s = validate_newton_schulz(G, steps, coefficients, eps)
    if G.numel() == 0:  # an empty batch: nothing to launch
        return torch.empty(G.shape, dtype=G.dtype, device=G.device)
    return _scripted()["newton_schulz"](G, s["steps"], s["a"], s["b"], s["c"], s["eps"])
