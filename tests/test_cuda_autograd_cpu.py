"""Level 5's C++ glue on a CPU: the real cuda_kernels/autograd.cpp, compiled with g++, run
against torch twins of the kernel ops and checked by the harness like any level.

autograd.cpp is all that lies between a Level 5 call and its kernels (reshapes, copies, NHWC
permutes, the LSTM's row orders, the backward GEMMs, the mixed-dtype BatchNorm update), and
it reaches the kernel ops through the dispatcher only. So here the binding's own schemas are
registered for the CPU, each op a twin written in torch from the contract the CUDA op
documents (its *_binding.cpp and .cu): what it reads in which layout, what it returns in which
dtype and row order, where it rounds to 16 bits; and a twin refuses what its binding refuses.
Passing proves the glue, given kernels that keep their contract: whether they do is
tests/test_cuda_<component>.py's business, on a GPU, where this module skips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import math
import os
import shutil
import warnings
from pathlib import Path

import levels  # noqa: F401 - first: it switches Triton's interpreter on where there is no GPU

import pytest
import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

from cuda_kernels import attention as k_attention, build, conv_bn as k_conv_bn
from cuda_kernels import layer_norm as k_layer_norm, lstm as k_lstm, mlp as k_mlp
from cuda_kernels import newton_schulz as k_newton_schulz
from cuda_kernels import rms_norm as k_rms_norm, rope as k_rope, swiglu_mlp as k_swiglu_mlp
from equivalence import specs
from equivalence.cards import as_view
from equivalence.check import check, check_args, clone_layout, compare, flatten
from equivalence.tolerances import tolerance
from levels import native
from levels.contract import COMPONENTS, validate_attention
from tests.test_bad_inputs import BY_KEY, COMPUTE, judge


def _why_not_here() -> str | None:
    from torch.utils import cpp_extension

    if torch.cuda.is_available():
        return ("a CUDA GPU is present: the real Level 5 library owns torch.ops.levels_cuda "
                "(tests/test_cuda_<component>.py test it)")
    compiler = os.environ.get("CXX", "c++")  # what torch.utils.cpp_extension runs (g++ here)
    if shutil.which(compiler) is None:
        return (f"needs a C++ compiler to build cuda_kernels/autograd.cpp: {compiler!r} ($CXX, "
                f"default c++) is not on PATH")
    if not any((Path(d) / "torch" / "library.h").exists() for d in cpp_extension.include_paths()):
        return "this torch has no C++ headers (torch/library.h) to build autograd.cpp against"
    if not cpp_extension.is_ninja_available():
        return "needs ninja (torch.utils.cpp_extension builds with it)"
    return None


if (_reason := _why_not_here()) is not None:
    pytest.skip(_reason, allow_module_level=True)

SEED = 20260522  # fixed: a failure replays with the same numbers
F32, BF16 = torch.float32, torch.bfloat16


# ---------------------------------------------------------------------------------------
# The twins: the kernel ops' contract, in torch
# ---------------------------------------------------------------------------------------

def _refuse(ok: bool, op: str, what: str) -> None:
    if not ok:
        raise RuntimeError(f"levels_cuda::{op}: {what} (the CUDA op refuses this)")


def _expect(op, name, t, shape, dtype, dense=False) -> None:
    ok = tuple(t.shape) == tuple(shape) and t.dtype == dtype and (not dense or t.is_contiguous())
    _refuse(ok, op, f"'{name}' must be {'contiguous ' if dense else ''}{dtype} {tuple(shape)}; "
                f"got {t.dtype} {tuple(t.shape)} with strides {t.stride()}")


def _version(op, version, known) -> None:
    _refuse(version in known, op, f"version {version} does not exist")


# layer_norm.cu: x (M, N) with adjacent columns (any row stride); mean, rstd fp32 per row.
# Version 0 (RULE): the binding picks the version for x; both compute the same function here.
LN_VERSIONS = {k_layer_norm.RULE: "the measured rule", **k_layer_norm.VERSIONS}


def layer_norm_fwd(x, weight, bias, eps, version, path=0):
    _version("layer_norm_fwd", version, LN_VERSIONS)
    _refuse(path == 0 or path in k_layer_norm.PATHS.get(version, {}), "layer_norm_fwd",
            f"version {version} has no path {path}")
    _refuse(x.size(1) == 1 or x.stride(1) == 1, "layer_norm_fwd", "'x': adjacent columns")
    for name, t in (("weight", weight), ("bias", bias)):
        _expect("layer_norm_fwd", name, t, (x.size(1),), x.dtype, dense=True)
    x32 = x.float()
    mean = x32.mean(1)
    rstd = torch.rsqrt(((x32 - mean[:, None]) ** 2).mean(1) + eps)
    y = (x32 - mean[:, None]) * rstd[:, None] * weight.float() + bias.float()
    return y.to(x.dtype), mean, rstd


def layer_norm_bwd(dy, x, weight, mean, rstd, version, path=0):
    op, (M, N) = "layer_norm_bwd", x.shape
    _version(op, version, LN_VERSIONS)
    _refuse(path == 0 or path in k_layer_norm.PATHS.get(version, {}), op,
            f"version {version} has no path {path}")
    _refuse(dy.shape == x.shape and (N == 1 or dy.stride(1) == x.stride(1) == 1), op,
            "'dy' and 'x' must be (M, N) with adjacent columns")
    _expect(op, "weight", weight, (N,), x.dtype, dense=True)
    for name, t in (("mean", mean), ("rstd", rstd)):
        _expect(op, name, t, (M,), F32, dense=True)
    xhat = (x.float() - mean[:, None]) * rstd[:, None]  # from the forward's statistics
    g = dy.float() * weight.float()
    dx = rstd[:, None] * (g - g.mean(1, keepdim=True) - xhat * (g * xhat).mean(1, keepdim=True))
    dt = weight.dtype
    return dx.to(x.dtype), (dy.float() * xhat).sum(0).to(dt), dy.float().sum(0).to(dt)


# rms_norm.cu: x (M, N) with adjacent columns (any row stride); rstd fp32 per row.
def rms_norm_fwd(x, weight, eps, version):
    _version("rms_norm_fwd", version, k_rms_norm.VERSIONS)
    _refuse(x.size(1) == 1 or x.stride(1) == 1, "rms_norm_fwd", "'x': adjacent columns")
    _expect("rms_norm_fwd", "weight", weight, (x.size(1),), x.dtype, dense=True)
    x32 = x.float()
    rstd = torch.rsqrt((x32 * x32).mean(1) + eps)
    return (x32 * rstd[:, None] * weight.float()).to(x.dtype), rstd


def rms_norm_bwd(dy, x, weight, rstd, version, force=0):
    op, (M, N) = "rms_norm_bwd", x.shape
    _version(op, version, k_rms_norm.VERSIONS)
    _refuse(force == 0 or force in k_rms_norm.FORCES.get(version, ()), op,
            "'force': 0, or one of version 4's rows an iteration")
    _refuse(dy.shape == x.shape and (N == 1 or dy.stride(1) == x.stride(1) == 1), op,
            "'dy' and 'x' must be (M, N) with adjacent columns")
    _expect(op, "weight", weight, (N,), x.dtype, dense=True)
    _expect(op, "rstd", rstd, (M,), F32, dense=True)
    xhat = x.float() * rstd[:, None]  # from the forward's statistic
    g = dy.float() * weight.float()
    dx = rstd[:, None] * (g - xhat * (g * xhat).mean(1, keepdim=True))
    return dx.to(x.dtype), (dy.float() * xhat).sum(0).to(weight.dtype)


# attention.cu: stride 1 along D, and 16-byte chunks at versions 3-5 in 16 bits; lse fp32 in
# base 2, log2 sum_j 2^(scale log2(e) q.k_j); the backward recomputes P from lse and takes
# delta = rowsum(dO * O) from the forward's out.
def _operands(op, version, like, **named) -> None:
    chunks = version in k_attention.TENSOR_CORE_VERSIONS and like.dtype != F32
    for name, t in named.items():
        _expect(op, name, t, t.shape, like.dtype)
        _refuse(t.stride(-1) == 1, op, f"'{name}' must have stride 1 along D")
        _refuse(not chunks or t.data_ptr() % 16 == 0 and all(
            t.size(d) == 1 or t.stride(d) % 8 == 0 for d in range(3)), op,
            f"'{name}' (tensor cores) must be 16-byte aligned with strides multiples of 8")


def _grouped(q, t):
    """K or V as each query head reads it: head h // group (the kernels index, no copy)."""
    return t.repeat_interleave(q.shape[1] // t.shape[1], 1)


def _scores_log2(q, k, causal, scale, bottom_right, kv_lens):
    # the kernels' mask: keys [0, kv_lens[b]), causal j <= i + shift; an unseen key is -inf
    s = q.float() @ _grouped(q, k).float().transpose(-2, -1) * (scale * math.log2(math.e))
    seen = native.attention_visible(q.shape[2], k.shape[2], causal, bottom_right, kv_lens, q.device)
    return s if seen is None else s.masked_fill(~seen.squeeze(2), float("-inf"))


def _kernel_rules(op, version, q, k, causal, bottom_right, kv_lens):
    _version(op, version, k_attention.VERSIONS)
    _refuse(kv_lens is None or (kv_lens.dtype == torch.int32 and kv_lens.is_contiguous()
                                and tuple(kv_lens.shape) == (q.shape[0],)), op,
            "'kv_lens' a contiguous int32 (B,) tensor")
    # versions 3-5 in 16 bits: the common case only (attention.cu's `grown`)
    _refuse(not k_attention.supported(version, q, k, causal, kv_lens), op,
            "this version does not support these sizes or layouts")


def _turned(x, cos, sin, interleaved, offset, sign=1.0):
    """RoPE fused (ROPE_API.md) as the kernels do it: x rotated by sign times the angles of
    table rows offset .. offset + N - 1, in fp32 (None: x as it is)."""
    if cos is None:
        return x
    N, half = x.shape[2], x.shape[3] // 2
    c, s = cos[offset:offset + N].float(), sign * sin[offset:offset + N].float()
    x32 = x.float()
    x1, x2 = (x32[..., 0::2], x32[..., 1::2]) if interleaved else x32.split(half, -1)
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    return torch.stack((y1, y2), -1).flatten(-2) if interleaved else torch.cat((y1, y2), -1)


def attention_fwd(q, k, v, causal, scale, version, bottom_right=False, kv_lens=None,
                  rope_cos=None, rope_sin=None, rope_interleaved=False, rope_offset=0):
    _kernel_rules("attention_fwd", version, q, k, causal, bottom_right, kv_lens)
    _operands("attention_fwd", version, q, q=q, k=k, v=v)
    dtype = q.dtype  # the kernel's output: q's dtype (the turned tiles are fp32 here)
    q = _turned(q, rope_cos, rope_sin, rope_interleaved, rope_offset)
    k = _turned(k, rope_cos, rope_sin, rope_interleaved, 0)
    s = _scores_log2(q, k, causal, scale, bottom_right, kv_lens)
    m = s.amax(-1, keepdim=True) if s.shape[-1] else s.sum(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    total = torch.exp2(s - m).sum(-1, keepdim=True)
    # a query that sees no key: out 0, lse +inf
    lse = torch.where(total > 0, m + torch.log2(total), torch.full_like(m, float("inf")))
    return (torch.exp2(s - lse) @ _grouped(q, v).float()).to(dtype), lse.squeeze(-1)


def attention_bwd(dout, q, k, v, out, lse, causal, scale, version, bottom_right=False,
                  kv_lens=None, rope_cos=None, rope_sin=None, rope_interleaved=False,
                  rope_offset=0):
    op = "attention_bwd"
    _kernel_rules(op, version, q, k, causal, bottom_right, kv_lens)
    _operands(op, version, q, q=q, k=k, v=v, dout=dout)
    dtype = q.dtype
    _operands(op, 1, q, out=out)  # read element-wise only: no 16-byte rule
    q = _turned(q, rope_cos, rope_sin, rope_interleaved, rope_offset)
    k = _turned(k, rope_cos, rope_sin, rope_interleaved, 0)
    _expect(op, "lse", lse, q.shape[:3], F32, dense=True)
    p = torch.exp2(_scores_log2(q, k, causal, scale, bottom_right, kv_lens) - lse[..., None])
    do = dout.float()
    ds = p * (do @ _grouped(q, v).float().transpose(-2, -1) - (do * out.float()).sum(-1, keepdim=True))
    dq, dk = scale * ds @ _grouped(q, k).float(), scale * ds.transpose(-2, -1) @ q.float()
    dv = p.transpose(-2, -1) @ do

    def per_kv_head(t):  # the group's query heads summed into their K/V head
        B, H, N, D = t.shape
        return t.reshape(B, k.shape[1], H // k.shape[1], N, D).sum(2)
    # gradients of the rotated q and k, turned back (rope's backward: minus the angle)
    dq = _turned(dq, rope_cos, rope_sin, rope_interleaved, rope_offset, -1.0)
    dk = _turned(per_kv_head(dk), rope_cos, rope_sin, rope_interleaved, 0, -1.0)
    return dq.to(dtype), dk.to(dtype), per_kv_head(dv).to(dtype)


# gemm.cu: epilogue(a @ b + bias) of an fp32 accumulator, b the (K, N) matrix, any strides;
# exact (erf) GELU; the saved pre-activation and the GELU' epilogue's output in a's dtype.
def _gelu(v):
    return 0.5 * v * (1 + torch.erf(v * 0.5 ** 0.5))


def _acc(op, a, b, bias, version):
    _version(op, version, k_mlp.VERSIONS)
    _refuse(a.dim() == b.dim() == 2 and a.size(1) == b.size(0), op, "'a' (M, K), 'b' (K, N)")
    _refuse(bias is None or tuple(bias.shape) == (b.size(1),), op, "'bias' must be (N,)")
    acc = a.float() @ b.float()
    return acc if bias is None else acc + bias.float()


def gemm_matmul(a, b, bias, gelu, out_fp32, version):
    v = _acc("gemm_matmul", a, b, bias, version)
    return (_gelu(v) if gelu else v).to(F32 if out_fp32 else a.dtype)


def gemm_matmul_gelu_save(a, b, bias, version):
    v = _acc("gemm_matmul_gelu_save", a, b, bias, version)
    return _gelu(v).to(a.dtype), v.to(a.dtype)


def gemm_matmul_gelu_grad(a, b, pre, version):
    v = _acc("gemm_matmul_gelu_grad", a, b, None, version)
    _expect("gemm_matmul_gelu_grad", "pre", pre, v.shape, a.dtype)
    h = pre.float()  # GELU'(h) = Phi(h) + h phi(h)
    return (v * (0.5 * (1 + torch.erf(h * 0.5 ** 0.5))
                 + h * torch.exp(-0.5 * h * h) / (2 * math.pi) ** 0.5)).to(a.dtype)


def gemm_matmul_accumulate(c, a, b, bias, version):
    c.copy_(c.float() + _acc("gemm_matmul_accumulate", a, b, bias, version))


def gemm_column_sum(x, out_fp32, version):
    _version("gemm_column_sum", version, k_mlp.VERSIONS)
    return x.float().sum(0).to(F32 if out_fp32 else x.dtype)


def mlp_fwd(x, w1, b1, w2, b2, version):
    # act, pre: (M, hidden) views of rows padded to 8 elements, as mlp_binding.cpp allocates
    M, hidden = x.size(0), w1.size(0)
    act, pre = (x.new_empty((M, -(-hidden // 8) * 8))[:, :hidden] for _ in range(2))
    v = _acc("mlp_fwd", x, w1.t(), b1, version)
    pre.copy_(v)
    act.copy_(_gelu(v))
    return _acc("mlp_fwd", act, w2.t(), b2, version).to(x.dtype), pre, act


# gemm.cu's SwiGLU epilogues (swiglu_mlp_binding.cpp): act = silu(G) * U of the fp32 sums
# G = x W_gate^T, U = x W_up^T; with save, G and U in x's dtype, else two empty tensors; all
# (M, hidden) outputs rows padded to 8 elements. The derivative reads G, U in their dtype.
def _padded(like, rows, cols):
    return like.new_empty((rows, -(-cols // 8) * 8))[:, :cols]


def swiglu_mlp_gate_up(x, w_gate, w_up, save, version):
    op = "swiglu_mlp_gate_up"
    _refuse(w_gate.shape == w_up.shape, op, "'w_gate' and 'w_up' must be (hidden, K) alike")
    g, u = _acc(op, x, w_gate.t(), None, version), _acc(op, x, w_up.t(), None, version)
    act, gs, us = (_padded(x, *g.shape) for _ in range(3))
    act.copy_(g * torch.sigmoid(g) * u)
    if not save:
        return act, x.new_empty((0,)), x.new_empty((0,))
    return act, gs.copy_(g), us.copy_(u)


def swiglu_mlp_grad(dy, w_down, g, u, version):
    op = "swiglu_mlp_grad"
    d = _acc(op, dy, w_down, None, version)
    for name, t in (("g", g), ("u", u)):
        _expect(op, name, t, d.shape, dy.dtype)
    gf, uf = g.float(), u.float()
    s = torch.sigmoid(gf)
    dg, du = _padded(dy, *d.shape), _padded(dy, *d.shape)
    return dg.copy_(d * uf * s * (1 + gf * (1 - s))), du.copy_(d * gf * s)


# lstm.cu: of x, only xp (fp32 x W_ih^T + b_ih, made before) is read; the rows of xp, gates
# (activated i, f, g, o), cs (c_t) and dz are b*T + t, or t*B + b when time_major. c stays
# fp32, but each step reads h_{t-1} back from out and dz_{t+1} from dz, in the input dtype.
def _rows(time_major, B, T, t):
    return torch.arange(B) * (1 if time_major else T) + t * (B if time_major else 1)


def lstm_fwd(x2, w_ih, b_ih, xp, h0, c0, w_hh, b_hh, time_major, save, version):
    op, (B, H), dt = "lstm_fwd", h0.shape, h0.dtype
    _version(op, version, (k_lstm.PLAN, *k_lstm.VERSIONS))
    rows, I = x2.shape
    for name, t, shape, dense in (
            ("x2", x2, (rows, I), False), ("w_ih", w_ih, (4 * H, I), False),
            ("b_ih", b_ih, (4 * H,), False), ("h0", h0, (B, H), True), ("c0", c0, (B, H), True),
            ("w_hh", w_hh, (4 * H, H), True), ("b_hh", b_hh, (4 * H,), True)):
        _expect(op, name, t, shape, dt, dense)
    _expect(op, "xp", xp, (rows, 4 * H), F32, dense=True)
    T = rows // B
    out = h0.new_empty((B, T, H))
    gates, cs = (xp.new_empty((rows, n) if save else (0,)) for n in (4 * H, H))
    h, c = h0, c0.float()
    for t in range(T):
        r = _rows(time_major, B, T, t)
        i, f, g, o = (xp[r] + h.float() @ w_hh.float().t() + b_hh.float()).chunk(4, 1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        c = f * c + i * g
        out[:, t] = o * c.tanh()
        h = out[:, t]
        if save:
            gates[r], cs[r] = torch.cat((i, f, g, o), 1), c
    return out, h.clone(), c.to(dt), gates, cs


def lstm_bwd(dout, dh_n, dc_n, c0, w_hh, gates, cs, time_major, version):
    op, (B, T, H), dt = "lstm_bwd", dout.shape, dout.dtype
    _version(op, version, (k_lstm.PLAN, *k_lstm.VERSIONS))
    for name, t, shape, dtype, dense in (
            ("dout", dout, (B, T, H), dt, True), ("dh_n", dh_n, (B, H), dt, True),
            ("dc_n", dc_n, (B, H), dt, True), ("c0", c0, (B, H), dt, True),
            ("w_hh", w_hh, (4 * H, H), dt, False), ("gates", gates, (B * T, 4 * H), F32, True),
            ("cs", cs, (B * T, H), F32, True)):
        _expect(op, name, t, shape, dtype, dense)
    dz = dout.new_empty((B * T, 4 * H))
    rec, dc = torch.zeros(B, H), dc_n.float()  # rec: dz_{t+1} W_hh, what h_t gave step t+1
    for t in reversed(range(T)):
        r = _rows(time_major, B, T, t)
        dh = dout[:, t].float() + rec + (dh_n.float() if t == T - 1 else 0)
        gi, gf, gg, go = gates[r].chunk(4, 1)
        tc = cs[r].tanh()
        c_prev = cs[r - (B if time_major else 1)] if t > 0 else c0.float()
        dc = dc + dh * go * (1 - tc * tc)
        dz[r] = torch.cat((dc * gg * gi * (1 - gi), dc * c_prev * gf * (1 - gf),
                           dc * gi * (1 - gg * gg), dh * tc * go * (1 - go)), 1).to(dt)
        rec, dc = dz[r].float() @ w_hh.float(), dc * gf
    return dz, rec.to(dt), dc.to(dt)


# conv_bn.cu: x an (N, H, W, C_in) view (any strides), w (C_out, kH, kW, C_in) (any strides
# for the eval ops, which read it through its strides; contiguous for train_fwd and for
# train_bwd's w_k, which its convolutions read K-major), dout NHWC, the per-channel tensors all
# contiguous in x's dtype; outputs NHWC, dw in w's layout. Train: y is the fp32 convolution
# WITHOUT its bias (the batch mean absorbs it), mean its batch mean, the bias enters the
# running mean only, the running variance is unbiased. Eval: BN folded into w.
def _conv_args(op, x, w, version, dout=None, w_dense=False, **per_channel) -> None:
    _version(op, version, k_conv_bn.VERSIONS)
    _expect(op, "w", w, (w.size(0), w.size(1), w.size(2), x.size(3)), x.dtype, dense=w_dense)
    _refuse(dout is None or dout.is_contiguous() and dout.dtype == x.dtype, op, "'dout': NHWC")
    for name, t in per_channel.items():
        if t is not None:
            _expect(op, name, t, (w.size(0),), x.dtype, dense=True)


def _conv32(x, w, bias, stride, padding):  # NHWC in, NHWC out, fp32
    return F.conv2d(x.permute(0, 3, 1, 2).float(), w.permute(0, 3, 1, 2).float(), bias, stride,
                    padding).permute(0, 2, 3, 1).contiguous()


def _conv_grads(dy, x, w, stride, padding):
    """(dx, dy^T im2col(x)), NHWC and (C_out, kH, kW, C_in), fp32, dx through w."""
    dy, x, w = (t.permute(0, 3, 1, 2).float() for t in (dy, x, w))
    return (conv2d_input(x.shape, w, dy, stride, padding).permute(0, 2, 3, 1),
            conv2d_weight(x, w.shape, dy, stride, padding).permute(0, 2, 3, 1))


def conv_bn_eval_fwd(x, w, bias, gamma, beta, running_mean, running_var, stride, padding, eps,
                     version):
    _conv_args("conv_bn_eval_fwd", x, w, version, bias=bias, gamma=gamma, beta=beta,
               running_mean=running_mean, running_var=running_var)
    invstd = torch.rsqrt(running_var.float() + eps)
    scale = gamma.float() * invstd
    w_folded = (w.float() * scale[:, None, None, None]).to(w.dtype).contiguous()
    b_folded = ((0 if bias is None else bias.float()) - running_mean.float()) * scale + beta.float()
    return _conv32(x, w_folded, b_folded, stride, padding).to(x.dtype), w_folded, scale, invstd


def conv_bn_train_fwd(x, w, bias, gamma, beta, running_mean, running_var, stride, padding, eps,
                      momentum, version):
    _conv_args("conv_bn_train_fwd", x, w, version, w_dense=True, bias=bias, gamma=gamma,
               beta=beta, running_mean=running_mean, running_var=running_var)
    y = _conv32(x, w, None, stride, padding)
    P = y.numel() // y.size(-1)
    mean = y.reshape(P, -1).mean(0)
    var = ((y.reshape(P, -1) - mean) ** 2).mean(0)
    invstd = torch.rsqrt(var + eps)
    new_mean = (1 - momentum) * running_mean.float() + momentum * (
        mean if bias is None else mean + bias.float())
    new_var = (1 - momentum) * running_var.float() + momentum * var * P / (P - 1)
    scale = gamma.float() * invstd
    out = (y * scale + (beta.float() - mean * scale)).to(x.dtype)
    return out, y, mean, invstd, new_mean.to(running_mean.dtype), new_var.to(running_var.dtype)


def conv_bn_eval_bwd(dout, x, w, w_folded, bias, running_mean, scale, invstd, stride, padding,
                     version, need_dx=True):
    _conv_args("conv_bn_eval_bwd", x, w, version, dout, bias=bias, running_mean=running_mean)
    dx, G = _conv_grads(dout, x, w_folded, stride, padding)  # G: the folded weight's dW
    sum_dy = dout.float().sum((0, 1, 2))
    shift = (0 if bias is None else bias.float()) - running_mean.float()
    dgamma = invstd * ((w.float() * G).sum((1, 2, 3)) + shift * sum_dy)
    dt = x.dtype
    return (_dx_out(dx, dt, need_dx), _dw_out(G * scale[:, None, None, None], w),
            (scale * sum_dy).to(dt), dgamma.to(dt), sum_dy.to(dt))


def _dw_out(dw, w):
    # as conv_bn_binding.cpp: dw allocated like w (empty_like: w's strides where w is dense)
    return torch.empty_like(w).copy_(dw)


def _dx_out(dx, dtype, need_dx):
    # as conv_bn_binding.cpp: dx empty (0,) when x needs no gradient
    return dx.to(dtype).contiguous() if need_dx else dx.new_empty((0,), dtype=dtype)


def conv_bn_train_bwd(dout, x, w, w_k, y, mean, invstd, gamma, stride, padding, version,
                      need_dx=True):
    op, dt = "conv_bn_train_bwd", x.dtype
    _conv_args(op, x, w, version, dout, gamma=gamma)
    _expect(op, "w_k", w_k, w.shape, x.dtype, dense=True)
    _expect(op, "y", y, dout.shape, F32, dense=True)
    C = dout.size(-1)
    P = dout.numel() // C
    d, xhat = dout.reshape(P, C).float(), (y.reshape(P, C) - mean) * invstd
    s_dy, s_dyx = d.sum(0), (d * xhat).sum(0)
    # the convolution's output gradient, stored in x's dtype (its backward GEMMs read it so)
    dyc = (gamma.float() * invstd * (d - s_dy / P - xhat * s_dyx / P)).to(dt)
    dx, dw = _conv_grads(dyc.reshape(dout.shape), x, w_k, stride, padding)
    return (_dx_out(dx, dt, need_dx), _dw_out(dw, w), dyc.float().sum(0).to(dt),
            s_dyx.to(dt), s_dy.to(dt))


# rope.cu: x and the tables read through any (non-negative) strides, y contiguous; inverse
# rotates by -theta.
def rope_rotate(x, cos, sin, interleaved, inverse, version):
    _version("rope_rotate", version, k_rope.VERSIONS)
    B, H, N, D = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        _expect("rope_rotate", name, t, (N, D // 2), x.dtype)
    _refuse(all(s >= 0 for t in (x, cos, sin) for s in t.stride()), "rope_rotate",
            "negative stride")
    x32, c, s = x.float(), cos.float(), sin.float() * (-1 if inverse else 1)
    x1, x2 = (x32[..., 0::2], x32[..., 1::2]) if interleaved else x32.split(D // 2, -1)
    y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
    y = torch.stack((y1, y2), -1).flatten(-2) if interleaved else torch.cat((y1, y2), -1)
    return y.to(x.dtype).contiguous()


def newton_schulz(G, steps, a, b, c, eps, version):
    # newton_schulz.cu: fp32 sums, A, B and each iterate rounded to G's dtype; the scale
    # 1/(||G|| + eps) per matrix, folded into the first step (A by s^2, the update by s); a
    # tall G iterated transposed; a batch (B, rows, cols) matrix by matrix, an empty one
    # launching nothing; the result contiguous in G's shape
    _refuse(G.dim() in (2, 3) and G.shape[-2] > 0 and G.shape[-1] > 0 and steps >= 0,
            "newton_schulz", "bad G or steps")
    if G.numel() == 0:
        return torch.empty(G.shape, dtype=G.dtype)
    tall = G.shape[-2] > G.shape[-1]
    x = (G.mT if tall else G).float()
    s = 1.0 / (torch.sqrt((x * x).sum((-2, -1), keepdim=True)) + eps)
    if steps == 0:
        out = (s * x).to(G.dtype)
    for step in range(steps):
        k = s if step == 0 else 1.0
        A = (k * k * (x @ x.mT)).to(G.dtype).float()
        B = (c * (A @ A) + b * A).to(G.dtype).float()
        out = (k * (a * x + B @ x)).to(G.dtype)
        x = out.float()
    return (out.mT if tall else out).contiguous()


TWINS = {f.__name__: f for f in (newton_schulz,
    layer_norm_fwd, layer_norm_bwd, attention_fwd, attention_bwd, gemm_matmul,
    gemm_matmul_gelu_save, gemm_matmul_gelu_grad, gemm_matmul_accumulate, gemm_column_sum,
    mlp_fwd, lstm_fwd, lstm_bwd, conv_bn_eval_fwd, conv_bn_train_fwd, conv_bn_eval_bwd,
    conv_bn_train_bwd, rms_norm_fwd, rms_norm_bwd, rope_rotate, swiglu_mlp_gate_up,
    swiglu_mlp_grad)}


def kernel_op_schemas() -> dict[str, str]:
    """name -> schema of every kernel op of the binding (autograd.cpp's own ops aside)."""
    name = lambda schema: torch._C.parse_schema(schema).name  # noqa: E731
    own = {name(s) for s in build.op_schemas(build.autograd_source())}
    return {name(s): s for s in build.op_schemas(build.cpp_source()) if name(s) not in own}


@pytest.fixture(scope="session")
def cpp_ops(pytestconfig, tmp_path_factory):
    """torch.ops.levels_cuda: the twins, and autograd.cpp built for the CPU over them, once
    per text of the file (and torch version): the build directory is keyed by both."""
    from torch.utils import cpp_extension

    source = build.autograd_source()  # behind a #line directive: errors name the real file
    key = hashlib.sha256((source + torch.__version__).encode()).hexdigest()[:16]
    cache = getattr(pytestconfig, "cache", None)  # None under -p no:cacheprovider
    directory = (cache.mkdir(f"cuda-autograd-cpu-{key}") if cache is not None
                 else tmp_path_factory.mktemp("cuda-autograd-cpu"))
    copy = directory / build.AUTOGRAD  # never rewritten: ninja's timestamps stay warm even
    if not copy.exists():  # after a checkout touches the original
        copy.write_text(source)
    lib = torch.library.Library(build.OP_NAMESPACE, "FRAGMENT")
    for name, schema in kernel_op_schemas().items():
        lib.define(schema)
        lib.impl(name, TWINS[name], "CPU")
    cpp_extension.load(name="levels_cuda_autograd_cpu", sources=[str(copy)], extra_cflags=["-O1"],
                       build_directory=str(directory), with_cuda=False, is_python_module=False)
    yield getattr(torch.ops, build.OP_NAMESPACE)
    lib._destroy()


# ---------------------------------------------------------------------------------------
# The C++ ops, called with the arguments cuda_kernels/<component>.py gives them
# ---------------------------------------------------------------------------------------

OPS = torch.ops.levels_cuda  # resolves each op when it is called: after the fixture ran


def layer_norm_op(x, weight, bias, eps=1e-5):
    return OPS.layer_norm(x, weight, bias, float(eps), k_layer_norm.resolve_version())


def attention_op(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
                 rope=None):
    # what levels.cuda.attention hands the op, from the contract's verdict
    s = validate_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    cos, sin = (None, None) if rope is None else rope[:2]
    version = k_attention.pick_version(None, q, k, causal, kv_lens, rope is not None)
    return OPS.attention(q, k, v, bool(causal), float(s["scale"]), version, s["bottom_right"],
                         kv_lens, cos, sin, bool(s["rope_interleaved"]), int(s["rope_offset"]))


def mlp_op(x, w1, b1, w2, b2):
    return OPS.mlp(x, w1, b1, w2, b2, k_mlp.resolve_version())


def lstm_op(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    out, h_n, c_n = OPS.lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, k_lstm.kernel_version(),
                             k_mlp.resolve_version())  # the MLP's version for its GEMMs
    return out, (h_n, c_n)


def conv_bn_op(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
               stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    pair = lambda v: [int(v)] * 2 if isinstance(v, int) else [int(i) for i in v]  # noqa: E731
    return OPS.conv_bn(
        x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, pair(stride),
        pair(padding), float(eps), float(momentum), bool(training), k_conv_bn.resolve_version())


def rms_norm_op(x, weight, eps=1e-6):
    return OPS.rms_norm(x, weight, float(eps), k_rms_norm.resolve_version())


def rope_op(x, cos, sin, interleaved=False):
    return OPS.rope(x, cos, sin, bool(interleaved), k_rope.resolve_version())


def swiglu_mlp_op(x, w_gate, w_up, w_down):
    return OPS.swiglu_mlp(x, w_gate, w_up, w_down, k_swiglu_mlp.resolve_version())


def newton_schulz_op(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    return OPS.newton_schulz(G, steps, *map(float, coefficients), float(eps),
                             k_newton_schulz.resolve_version())  # the kernel op is the call


CALLS = {"newton_schulz": newton_schulz_op, "layer_norm": layer_norm_op, "attention": attention_op, "mlp": mlp_op,
         "lstm": lstm_op, "conv_bn": conv_bn_op, "rms_norm": rms_norm_op, "rope": rope_op,
         "swiglu_mlp": swiglu_mlp_op}


# ---------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------

def test_every_kernel_op_of_the_binding_has_a_twin():
    assert sorted(kernel_op_schemas()) == sorted(TWINS)  # a new op needs its contract here


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("component", COMPONENTS)
def test_cpp_op_passes_the_harness(cpp_ops, component, dtype):
    # every variant in both layouts (strided: an LSTM x in time-major order, channels_last
    # images, stride-2 running statistics written through their views), forward, backward
    # and the forward again under no_grad
    results = check(component, fn=CALLS[component], dtype=dtype, size="tiny", seed=SEED)
    assert results and all(r.passed for r in results), "\n".join(r.summary() for r in results)


@contextlib.contextmanager
def _spying(*names):
    """Each named kernel op's twin, wrapped: yields the list of (name, args) of every call
    made while in the block, in order. The spies are registered over the twins by a library
    of their own, whose destruction afterwards leaves the twins in place again."""
    calls = []

    def spy(name):
        def kernel(*args, **kwargs):
            calls.append((name, args))
            return TWINS[name](*args, **kwargs)
        return kernel
    lib = torch.library.Library(build.OP_NAMESPACE, "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore", UserWarning)
        for name in names:
            lib.impl(name, spy(name), "CPU", allow_override=True)
    try:
        yield calls
    finally:
        lib._destroy()


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_conv_bn_skips_dgrad_when_x_needs_no_gradient(cpp_ops, training):
    # a network's input images need no gradient: autograd.cpp asks the backward op for no dx
    # (need_dx=False), so no dgrad runs (the stem's is the most expensive one); the parameters'
    # gradients are the ones a call with x requiring grad gets, bit for bit
    name = "conv_bn_train_bwd" if training else "conv_bn_eval_bwd"
    parameters = inspect.signature(TWINS[name]).parameters
    position = list(parameters).index("need_dx")
    with _spying(name) as calls:
        g = torch.Generator().manual_seed(SEED)
        x = torch.randn(2, 8, 9, 7, generator=g)
        params = [torch.randn(12, 8, 3, 3, generator=g), torch.randn(12, generator=g),
                  torch.rand(12, generator=g) + 0.5, torch.randn(12, generator=g)]
        stats = (torch.randn(12, generator=g), torch.rand(12, generator=g) + 0.5)
        grads = []
        for x_grad in (True, False):
            leaves = [t.clone().requires_grad_(True) for t in params]
            xi = x.clone().requires_grad_(x_grad)
            out = conv_bn_op(xi, *leaves, *(t.clone() for t in stats), 1, 1, training=training)
            out.backward(torch.ones_like(out))
            assert (xi.grad is not None) == x_grad
            grads.append([t.grad for t in leaves])
    # the dispatcher leaves out an argument equal to its default
    default = parameters["need_dx"].default
    assert [a[position] if len(a) > position else default for _, a in calls] == [True, False]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("weight_layout", ["oihw", "channels_last", "sliced"])
def test_conv_bn_weight_read_as_it_lies_and_its_gradient_in_its_layout(cpp_ops, training,
                                                                       weight_layout):
    # eval folds the caller's weight as it lies (no copy: the kernel op gets the permuted
    # view); training's convolution gets it K-major (w_k). dW comes back in the weight's own
    # layout, so that autograd keeps it in .grad as it is; the output is the one node's plain
    # output (no PermuteBackward after it), and an in-place op on it is allowed
    fwd = "conv_bn_train_fwd" if training else "conv_bn_eval_fwd"
    bwd = "conv_bn_train_bwd" if training else "conv_bn_eval_bwd"
    g = torch.Generator().manual_seed(SEED)
    big = torch.randn(10, 2 * 6, 3, 3, generator=g)
    w = {"oihw": big[:, :6].contiguous(),
         "channels_last": big[:, :6].contiguous(memory_format=torch.channels_last),
         "sliced": big[:, ::2]}[weight_layout].requires_grad_(True)
    x = torch.randn(2, 6, 7, 5, generator=g, requires_grad=True)
    bn = [torch.rand(10, generator=g) + 0.5, torch.randn(10, generator=g)]
    stats = [torch.randn(10, generator=g), torch.rand(10, generator=g) + 0.5]
    with _spying(fwd, bwd) as calls:
        out = conv_bn_op(x, w, None, *bn, *stats, 1, 1, training=training)
        assert "ConvBn" in out.grad_fn.name(), out.grad_fn.name()
        assert out.is_contiguous(memory_format=torch.channels_last)
        out.relu_()  # a ReLU(inplace=True) after the layer
        dout = torch.randn(out.shape, generator=g)
        out.backward(dout)
    (_, fwd_args), (_, bwd_args) = calls
    w_view = w.detach().permute(0, 2, 3, 1)
    if training:
        assert fwd_args[1].is_contiguous()
    else:
        assert fwd_args[1].data_ptr() == w.data_ptr() and fwd_args[1].stride() == w_view.stride()
    assert bwd_args[2].stride() == w_view.stride()  # the layout dW is allocated like
    if w.is_contiguous() or w.is_contiguous(memory_format=torch.channels_last):
        assert w.grad.stride() == w.stride()
    else:  # a strided view: dense in its own dimension order, which autograd keeps as it is
        assert w.grad.is_contiguous()
    # the values, against torch's own layers on float64 copies
    x64, w64 = (t.detach().double().requires_grad_(True) for t in (x, w))
    ref = F.batch_norm(F.conv2d(x64, w64, None, 1, 1), stats[0].double().clone(),
                       stats[1].double().clone(), bn[0].double(), bn[1].double(),
                       training).relu()
    ref.backward(dout.double())
    for got, want in ((out, ref), (x.grad, x64.grad), (w.grad, w64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


SWIGLU_INPUTS = ("x", "w_gate", "w_up", "w_down")
SWIGLU_BACKWARD_OPS = ("swiglu_mlp_grad", "gemm_matmul", "gemm_matmul_accumulate")


def _swiglu_args(flat=False):
    """The tiny case's fresh arguments: x (2, 9, 24), or its (18, 24) matrix when flat."""
    args = specs.get("swiglu_mlp").case("tiny", "default", F32, "cpu", SEED).args
    return dict(args, x=args["x"].flatten(0, -2)) if flat else args


@pytest.mark.parametrize("wanted", [("x",), ("w_gate",), ("w_up",), ("w_down",), ("x", "w_down"),
                                    SWIGLU_INPUTS], ids="+".join)
def test_swiglu_mlp_backward_runs_only_the_gemms_needed(cpp_ops, wanted):
    # needs_input_grad: dW_down is one GEMM; the others share the SiLU-mul derivative's GEMM
    # (dG, dU), then dX is a GEMM and an accumulating one, dW_gate and dW_up a GEMM each.
    # The gradients computed are the ones of a call where every input requires grad, bit for bit.
    args = _swiglu_args()
    every = {k: t.clone().requires_grad_(True) for k, t in args.items()}
    out = swiglu_mlp_op(**every)
    out.backward(torch.ones_like(out))
    leaves = {k: t.clone().requires_grad_(k in wanted) for k, t in args.items()}
    out = swiglu_mlp_op(**leaves)
    with _spying(*SWIGLU_BACKWARD_OPS) as calls:
        out.backward(torch.ones_like(out))
    gemms = ("w_down" in wanted) + ("x" in wanted) + ("w_gate" in wanted) + ("w_up" in wanted)
    expected = {"swiglu_mlp_grad": int(any(k in wanted for k in ("x", "w_gate", "w_up"))),
                "gemm_matmul": gemms, "gemm_matmul_accumulate": int("x" in wanted)}
    assert {n: sum(c == n for c, _ in calls) for n in SWIGLU_BACKWARD_OPS} == expected
    for k in SWIGLU_INPUTS:
        assert (leaves[k].grad is not None) == (k in wanted), k
        if k in wanted:
            torch.testing.assert_close(leaves[k].grad, every[k].grad, rtol=0, atol=0)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_swiglu_mlp_saves_g_and_u_only_for_a_backward(cpp_ops, grad):
    # Without autograd the gate/up GEMM writes act alone (save=False): no (M, hidden) G and U
    # that no backward would read; with it, x's (M, K) view (no copy) goes to the op.
    args = {k: t.requires_grad_(grad and k == "w_up") for k, t in _swiglu_args().items()}
    with _spying("swiglu_mlp_gate_up") as calls:
        out = swiglu_mlp_op(**args)
    [(_, (x2, _, _, save, _))] = calls
    assert save == grad and out.requires_grad == grad
    assert x2.shape == (18, 24) and x2.data_ptr() == args["x"].data_ptr()
    assert out.shape == (2, 9, args["w_down"].shape[0])


@pytest.mark.parametrize("kind", ["time_major", "last_every_other", "transposed"])
def test_swiglu_mlp_takes_x_in_any_layout(cpp_ops, kind):
    # time_major: the leading dimensions do not flatten, so x's (M, K) view is a copy;
    # last_every_other and a transposed 2-D x: views with K strided, as the GEMM ops take them
    args = _swiglu_args(flat=kind == "transposed")
    args["x"] = as_view(args["x"], kind)
    result = check_args("swiglu_mlp", args, fn=swiglu_mlp_op, seed=SEED)
    assert result.passed, result.summary()


@pytest.mark.parametrize("variant", ["train", "eval"])
def test_conv_bn_float32_batch_norm_beside_bfloat16_x(cpp_ops, variant):
    # autocast's mixed precision, judged as the bad-input table judges it at every level:
    # each output, buffer and gradient in its own dtype, within bfloat16's bound
    bad = dataclasses.replace(BY_KEY["conv_bn/batch-norm-float32"], variant=variant)
    outcome = judge(bad, conv_bn_op, False, bad.args("cpu"))
    assert outcome.ok, outcome.message
    # and the running statistics within float32's: updated in float32 from float32 batch
    # statistics, they must not carry bfloat16's rounding (nor a 1/(n-1) that bfloat16's
    # bound is too wide to see)
    args = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in bad.args("cpu").items()}
    ref = specs.get("conv_bn").reference(
        {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
    conv_bn_op(**args)
    for name, want in zip(("running_mean", "running_var"), ref[1:]):
        c = compare(name, args[name], want, tolerance(F32), F32)
        assert c.ok, c


@pytest.mark.parametrize("variant", ["train", "eval"])
def test_conv_bn_without_conv_bias(cpp_ops, variant):
    # no bias: no input of the node, no gradient returned for it, nothing in the running mean
    spec = specs.get("conv_bn")
    args = spec.case("tiny", variant, BF16, "cpu", SEED).args | {"conv_bias": None}
    result = check_args("conv_bn", args, fn=conv_bn_op, seed=SEED)
    assert result.passed, result.summary()


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "nothing_requires_grad"])
@pytest.mark.parametrize("component", COMPONENTS)
def test_forward_without_autograd(cpp_ops, component, mode):
    # The Functions run as plain forwards (autograd.cpp's forward_only: no node, nothing
    # packed): the same values, nothing that requires grad (inputs that do included), the
    # running statistics still updated. "nothing_requires_grad": grad mode on, no input
    # requiring a gradient (an inference forward outside no_grad).
    spec = specs.get(component)
    for variant in spec.variants:
        case = spec.case("tiny", variant, F32, "cpu", SEED)
        ref = spec.reference({k: v.double() if isinstance(v, torch.Tensor) else v
                              for k, v in case.args.items()})
        grads = mode != "nothing_requires_grad"
        args = {k: clone_layout(v).requires_grad_(grads and k in case.differentiable)
                if isinstance(v, torch.Tensor) else v for k, v in case.args.items()}
        with (torch.no_grad() if mode == "no_grad" else torch.inference_mode()
              if mode == "inference_mode" else contextlib.nullcontext()):
            outs = flatten(CALLS[component](**args)) + [args[m] for m in case.mutated]
        for name, got, want in zip(case.outputs, outs, ref):
            assert not got.requires_grad, f"{component}[{variant}] {name} requires grad"
            c = compare(name, got, want, tolerance(F32), F32)
            assert c.ok, f"{component}[{variant}] {mode}: {c}"


def test_forward_mode_tangent_still_goes_through_apply(cpp_ops):
    # A dual tensor requires no gradient, yet the no-autograd shortcut must not take it: it
    # would drop the tangent silently, where Function::apply refuses it by name.
    import torch.autograd.forward_ad as fwAD

    x, w, b = torch.randn(2, 5, 129), torch.randn(129), torch.randn(129)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match="jvp is not implemented"):
            layer_norm_op(dual, w, b)


@pytest.mark.parametrize("operand", ["misaligned", "strided_head_dim"])
def test_attention_copies_what_its_kernels_cannot_read(cpp_ops, operand):
    # Every version needs stride 1 along D; versions 3-5 in 16 bits read 16-byte chunks, so
    # a view that starts off a 16-byte boundary is cloned (.contiguous() would return it).
    g = torch.Generator().manual_seed(SEED)

    def view():
        if operand == "misaligned":  # contiguous, one element past an aligned start
            return torch.randn(2 * 37 * 16 + 1, generator=g).to(BF16)[1:].view(1, 2, 37, 16)
        return torch.randn(1, 2, 16, 37, generator=g).to(BF16).transpose(-2, -1)

    result = check_args("attention", dict(q=view(), k=view(), v=view(), causal=True),
                        fn=attention_op, seed=SEED)
    assert result.passed, result.summary()


EMPTY_KEYS = sorted(k for k, b in BY_KEY.items()  # the computed ones: a refusal is the
                    if b.slug in ("empty", "empty-train", "no-positions")  # contract's, not the op's
                    and b.expectation("cuda") == COMPUTE)


@pytest.mark.parametrize("key", EMPTY_KEYS)
def test_empty_tensors_as_torch(cpp_ops, key):
    # A batch of 0 (rope: also no positions), judged as the bad-input table judges every
    # level: empty outputs, zero gradients of the parameters, running statistics untouched.
    # The twins compute on what they are given, so a kernel op the glue should not call here
    # shows: lstm_fwd cannot take B = 0 (T is B*T rows / B), conv_bn_train_fwd would track
    # the NaN statistics of no pixel.
    bad = BY_KEY[key]
    outcome = judge(bad, CALLS[bad.component], False, bad.args("cpu"))
    assert outcome.ok, f"{key}: {outcome.message}"


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_attention_rope_reaches_both_kernel_ops(cpp_ops, interleaved, alignment):
    # RoPE fused at Level 5 (ROPE_API.md): autograd.cpp hands the tables to the forward and
    # backward ops (here their twins), the result is attention of rope(q), rope(k) with the
    # queries at rows off.. (off = Nk - Nq bottom-right), and gradients reach q and k only.
    g = torch.Generator().manual_seed(SEED)
    B, H, Hkv, Nq, Nk, D, P = 2, 4, 2, 5, 9, 16, 12
    q, k, v = (torch.randn(s, generator=g) for s in ((B, H, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D)))
    angles = torch.randn(P, D, generator=g)
    cos, sin = angles.cos()[:, ::2], angles.sin()[:, 1::2]  # strided tables, as slices are
    off = Nk - Nq if alignment == "bottom_right" else 0
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = OPS.attention(*leaves, True, 0.3, 2, alignment == "bottom_right", None, cos, sin,
                        interleaved, off)
    dout = torch.randn(out.shape, generator=g)
    out.backward(dout)
    ref = [t.double().requires_grad_(True) for t in (q, k, v)]
    c64, s64 = cos.double(), sin.double()
    want = native.attention_math(native.rope_math(ref[0], c64[off:off + Nq], s64[off:off + Nq], interleaved),
                                 native.rope_math(ref[1], c64[:Nk], s64[:Nk], interleaved), ref[2], True, 0.3,
                                 alignment == "bottom_right")
    want.backward(dout.double())
    for got, exp in [(out, want)] + [(a.grad, b.grad) for a, b in zip(leaves, ref)]:
        torch.testing.assert_close(got.double(), exp, rtol=1e-5, atol=1e-5)
