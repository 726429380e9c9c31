"""Conv2d + BatchNorm2d at Level 5: the Python side of `conv_bn.cu` (kernels) and
`conv_bn_binding.cpp` (the ops `torch.ops.levels_cuda.conv_bn_*`).

Four custom ops, all functional (they return new tensors, never write their inputs):

    conv_bn_eval_fwd   fold BN into the weight, one convolution   -> out, w_folded, scale, invstd
    conv_bn_train_fwd  convolution (fp32 y), batch statistics, BN -> out, y, mean, invstd,
                                                                     new running_mean, new running_var
    conv_bn_eval_bwd / conv_bn_train_bwd                          -> dx, dw, dbias, dgamma, dbeta

`_register()` (called by build.load() once the library is loaded) gives every op a fake
implementation (shapes only: torch.compile and opcheck trace through it) and the two forward
ops an autograd formula that calls the matching backward op. The running statistics are
updated here, in Python, by copying the op's new values into the caller's buffers: the ops
stay functional, and a buffer that is a strided view of something bigger is written through
that view and nowhere else.

The version ladder (LEVELS_CUDA_VERSION_CONV_BN or version=) picks the forward convolution
kernel; the backward (dgrad, wgrad) runs the version-2 tiled kernels for every version.
"""

from __future__ import annotations


import torch

from . import versions

VERSIONS = {
    1: "direct convolution, one thread per output element",
    2: "implicit GEMM with shared-memory tiles and 4x4 register tiles (CUDA cores, exact fp32)",
    3: "implicit GEMM on tensor cores (WMMA, cp.async 4-stage pipeline), BN folded in the "
       "epilogue; fp32 inputs run version 2",
}
DEFAULT_VERSION = 3
ENV_VERSION = "LEVELS_CUDA_VERSION_CONV_BN"

OPS = ("conv_bn_eval_fwd", "conv_bn_train_fwd", "conv_bn_eval_bwd", "conv_bn_train_bwd")

_registered = False


def uses_tf32(device, dtype) -> bool:
    # Version 3 does not run fp32 on the tensor cores (it falls back to version 2), so every
    # version is exact fp32 arithmetic for fp32 inputs.
    return False


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_CONV_BN if set, else DEFAULT_VERSION (cuda_kernels/versions.py)."""
    return versions.resolve("conv_bn", VERSIONS, DEFAULT_VERSION, version)


def _out_hw(H, W, kH, kW, stride, padding):
    return ((H + 2 * padding[0] - kH) // stride[0] + 1,
            (W + 2 * padding[1] - kW) // stride[1] + 1)


def _ops():
    from . import build
    return build.ops()


# ---------------------------------------------------------------------------------------
# Registration: fake implementations and autograd.
# ---------------------------------------------------------------------------------------

def _fake_eval_fwd(x, w, bias, gamma, beta, running_mean, running_var, stride, padding, eps,
                   version):
    N, H, W, C_in = x.shape
    C_out, kH, kW, _ = w.shape
    Ho, Wo = _out_hw(H, W, kH, kW, stride, padding)
    f32 = dict(dtype=torch.float32, device=x.device)
    return (x.new_empty((N, Ho, Wo, C_out)), w.new_empty((C_out, kH, kW, C_in)),
            torch.empty((C_out,), **f32), torch.empty((C_out,), **f32))


def _fake_train_fwd(x, w, bias, gamma, beta, running_mean, running_var, stride, padding, eps,
                    momentum, version):
    N, H, W, _ = x.shape
    C_out, kH, kW, _ = w.shape
    Ho, Wo = _out_hw(H, W, kH, kW, stride, padding)
    f32 = dict(dtype=torch.float32, device=x.device)
    return (x.new_empty((N, Ho, Wo, C_out)), torch.empty((N, Ho, Wo, C_out), **f32),
            torch.empty((C_out,), **f32), torch.empty((C_out,), **f32),
            running_mean.new_empty((C_out,)), running_var.new_empty((C_out,)))


def _fake_bwd(x, w):
    C_out = w.shape[0]
    return (x.new_empty(x.shape), w.new_empty(w.shape), x.new_empty((C_out,)),
            x.new_empty((C_out,)), x.new_empty((C_out,)))


def _fake_eval_bwd(dout, x, w, w_folded, bias, running_mean, scale, invstd, stride, padding,
                   version):
    return _fake_bwd(x, w)


def _fake_train_bwd(dout, x, w, y, mean, invstd, gamma, stride, padding, version):
    return _fake_bwd(x, w)


def _setup_eval(ctx, inputs, output):
    x, w, bias, gamma, beta, running_mean, running_var, stride, padding, eps, version = inputs
    _, w_folded, scale, invstd = output
    ctx.save_for_backward(x, w, w_folded, bias, running_mean, scale, invstd)
    ctx.conv = (list(stride), list(padding), version)
    ctx.has_bias = bias is not None


def _backward_eval(ctx, dout, *unused):
    x, w, w_folded, bias, running_mean, scale, invstd = ctx.saved_tensors
    stride, padding, version = ctx.conv
    # The kernels read dout as a (P, C_out) matrix: a copy only when autograd's gradient is
    # not NHWC-contiguous already (i.e. the caller's upstream gradient was not channels_last).
    dx, dw, db, dgamma, dbeta = torch.ops.levels_cuda.conv_bn_eval_bwd(
        dout.contiguous(), x, w, w_folded, bias, running_mean, scale, invstd, stride, padding,
        version)
    return (dx, dw, db if ctx.has_bias else None, dgamma, dbeta,
            None, None, None, None, None, None)


def _setup_train(ctx, inputs, output):
    x, w, bias, gamma, beta, running_mean, running_var, stride, padding, eps, momentum, version = inputs
    _, y, mean, invstd, _, _ = output
    ctx.save_for_backward(x, w, y, mean, invstd, gamma)
    ctx.conv = (list(stride), list(padding), version)
    ctx.has_bias = bias is not None


def _backward_train(ctx, dout, *unused):
    x, w, y, mean, invstd, gamma = ctx.saved_tensors
    stride, padding, version = ctx.conv
    dx, dw, db, dgamma, dbeta = torch.ops.levels_cuda.conv_bn_train_bwd(
        dout.contiguous(), x, w, y, mean, invstd, gamma, stride, padding, version)
    return (dx, dw, db if ctx.has_bias else None, dgamma, dbeta,
            None, None, None, None, None, None, None)


def _register() -> None:
    """Fake implementations for every op, autograd for the forward ops (once per process)."""
    global _registered
    if _registered:
        return
    lib = "levels_cuda::"
    torch.library.register_fake(lib + "conv_bn_eval_fwd", _fake_eval_fwd)
    torch.library.register_fake(lib + "conv_bn_train_fwd", _fake_train_fwd)
    torch.library.register_fake(lib + "conv_bn_eval_bwd", _fake_eval_bwd)
    torch.library.register_fake(lib + "conv_bn_train_bwd", _fake_train_bwd)
    torch.library.register_autograd(lib + "conv_bn_eval_fwd", _backward_eval,
                                    setup_context=_setup_eval)
    torch.library.register_autograd(lib + "conv_bn_train_fwd", _backward_train,
                                    setup_context=_setup_train)
    _registered = True


# ---------------------------------------------------------------------------------------
# The entry point (levels/cuda.py calls it after levels.contract.validate_conv_bn).
# ---------------------------------------------------------------------------------------

def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride, padding, eps, momentum, training, version=None):
    """Conv2d then BatchNorm2d; stride and padding as int pairs. Returns (N, C_out, H_out,
    W_out) in channels_last. Training mode updates running_mean/running_var in place."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"conv_bn: argument 'x' must be float16, bfloat16 or float32 for the CUDA "
                        f"kernels; got {x.dtype}")
    version = resolve_version(version)
    ops = _ops()
    # What each argument becomes, and what it costs:
    # - x: channels_last (a no-op when it already is, one copy of x otherwise), viewed as
    #   (N, H, W, C_in) — a permute, no copy. The kernels take all four strides of that view.
    # - conv_weight: (C_out, kH, kW, C_in) contiguous, so that the reduction k = (i, j, c) runs
    #   along memory: one copy of the (small) weight unless it is stored that way already.
    #   Done out here, autograd differentiates the permute/copy: dW comes back in the caller's
    #   layout.
    # - the 1-D parameters and buffers: .contiguous() (a copy only for strided views; C_out
    #   elements).
    x_nhwc = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    w_k = conv_weight.permute(0, 2, 3, 1).contiguous()
    b = conv_bias.contiguous() if conv_bias is not None else None
    gamma, beta = bn_weight.contiguous(), bn_bias.contiguous()
    rm, rv = running_mean.contiguous(), running_var.contiguous()
    stride, padding = [int(s) for s in stride], [int(p) for p in padding]
    if not training:
        out = ops.conv_bn_eval_fwd(x_nhwc, w_k, b, gamma, beta, rm, rv, stride, padding,
                                   float(eps), version)[0]
    else:
        out, _, _, _, new_mean, new_var = ops.conv_bn_train_fwd(
            x_nhwc, w_k, b, gamma, beta, rm, rv, stride, padding, float(eps), float(momentum),
            version)
        # In place through the caller's views (BatchNorm2d's semantics), nothing else written.
        with torch.no_grad():
            running_mean.copy_(new_mean)
            running_var.copy_(new_var)
    # (N, H_out, W_out, C_out) contiguous, seen as (N, C_out, H_out, W_out): channels_last.
    return out.permute(0, 3, 1, 2)
