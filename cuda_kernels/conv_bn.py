"""Conv2d + BatchNorm2d at Level 5: the Python side of `conv_bn.cu` (kernels) and
`conv_bn_binding.cpp` (the ops `torch.ops.levels_cuda.conv_bn_*`).

Four custom ops, all functional (they return new tensors, never write their inputs):

    conv_bn_eval_fwd   fold BN into the weight, one convolution   -> out, w_folded, scale, invstd
    conv_bn_train_fwd  convolution (fp32 y), batch statistics, BN -> out, y, mean, invstd,
                                                                     new running_mean, new running_var
    conv_bn_eval_bwd / conv_bn_train_bwd                          -> dx, dw, dbias, dgamma, dbeta
        (their last argument need_dx=False: x needs no gradient, dx comes back empty (0,) and
        no dgrad runs: a network's input images)

`_register()` (called by build.load() once the library is loaded) gives every op a fake
implementation (shapes only: torch.compile and opcheck trace through it). A call is one
more op, `levels_cuda::conv_bn` (autograd.cpp): the layout copies, the forward op of
its mode, one C++ autograd node whose backward calls the matching backward op, and the
running statistics' update in training mode, by copying the kernel op's new values into the
caller's buffers: the kernel ops stay functional, and a buffer that is a strided view of
something bigger is written through that view and nowhere else.

The version ladder (LEVELS_CUDA_VERSION_CONV_BN or version=) picks the kernels: versions 1-3
differ in the forward convolution and share version 2's tiled backward (dgrad, wgrad);
version 4 keeps version 3's forward and runs the backward on the tensor cores too, and 1x1
stride-1 convolutions through gemm.cu's GEMM; version 5 keeps version 4's backward and gives the
forward mma.sync tiles fitted to the problem, split-K where even the smallest leaves SMs idle
(the top of conv_bn.cu says how and why; $LEVELS_CONV_BN_V5_PLAN pins its plan for tests);
version 6 keeps version 5's forward and runs the backward on mma.sync too: the dgrad's stride
phases on version 5's kernels and plan rule, with a narrow 128x16 tile for C_in <= 16, and the
wgrad in tiles with pixel splits fitted to the problem ($LEVELS_CONV_BN_V6_DGRAD_PLAN and
$LEVELS_CONV_BN_V6_WGRAD_PLAN pin their plans).
"""

from __future__ import annotations

import os
import re

import torch

from . import versions

VERSIONS = {
    1: "direct convolution, one thread per output element",
    2: "implicit GEMM with shared-memory tiles and 4x4 register tiles (CUDA cores, exact fp32)",
    3: "implicit GEMM on tensor cores (WMMA, cp.async 4-stage pipeline), BN folded in the "
       "epilogue; backward as version 2; fp32 inputs run version 2",
    4: "version 3 plus dgrad (one implicit GEMM per stride phase) and wgrad (split over "
       "pixels) on the tensor cores, 1x1 stride-1 convs through gemm.cu's GEMM (wgmma on "
       "sm_90); fp32 inputs run version 2",
    5: "version 4 with the forward on mma.sync m16n8k16 + ldmatrix (swizzled tiles, cp.async "
       "pipeline) in a 128x128, 128x64 or 64x64 block tile chosen from the problem size "
       "(conv_bn_plan.h), K split into slices whose fp32 partials a finish kernel adds when "
       "even 64x64 leaves SMs idle; costs 12 more kernels to build and, when split, "
       "splits x P x C_out fp32 partials of traffic; backward and fp32 as version 4",
    6: "version 5 with the backward on mma.sync + ldmatrix: each stride phase of dx is a "
       "stride-1 forward convolution of dy by the phase's flipped, transposed taps of w, run on "
       "version 5's kernels with their fitted tiles and split-K (plus a 128x16 tile for "
       "C_in <= 16, the stem; 1x1 dgrads take the GEMM only for C_in >= 128), and wgrad reads "
       "its pixel-major tiles with ldmatrix.trans, 128x64 or 64x64 by C_out, pixel splits "
       "from the same cost model; costs a pass writing w' (C_out x K) per backward, split "
       "phases' fp32 partials, 22 more kernels to build; fp32 as version 2",
}
# Version 6 is the default. On the H100 (reports/h100-conv-bn7.json, scripts/device_conv_bn7.py,
# bf16 channels_last, kernel time, cuDNN + BatchNorm and version 5 in the same run) its training
# step is faster than version 5's at every ResNet-50 shape: the stem 0.90x cuDNN (version 5
# 0.31x: its dgrad 2.95 -> 0.46 ms on the 128x16 tile), layer3's 3x3 0.87x (0.62x), layer4's
# 0.69x (0.42x), layer1's 3x3 0.45x (0.35x), the 1x1s 0.55-1.03x; its eval forward is version 5's
# (1.16-1.93x cuDNN, 0.86x and 0.61x at layer3's and layer4's 3x3).
# Version 5's forward (reports/h100-conv-bn6.json) took the 3x3s' eval from 0.24-0.64x to
# 0.62-1.33x; version 4 (reports/h100-conv-bn-bias.json) made training 4-13x faster than
# version 3's CUDA-core backward.
# cuDNN's training times move between runs (layer2's 3x3 0.21 ms in one, 0.69 ms in the next,
# each tightly spread), ours by 2-10%: compare ratios within one run.
DEFAULT_VERSION = 6
TENSOR_CORE_VERSIONS = (3, 4, 5, 6)  # what `levels bench` times in training mode
ENV_VERSION = "LEVELS_CUDA_VERSION_CONV_BN"

# Version 5's plan pinned for tests and sweeps (conv_bn.cu's v5_forced reads it at every call):
# "TILE" or "TILE,SPLITS", TILE one of conv_bn_plan.h's tiles (0 128x128, 1 128x64, 2 64x64;
# -1: the rule's) and SPLITS K slices (0: the rule's; clamped to the k-tiles).
# Version 6's dgrad plan, the same form, TILE also 3 (128x16): every stride phase takes it; its
# wgrad plan, TILE 1 or 2 (0: the rule's; no 128x128 wgrad is built) and SPLITS pixel splits.
PLAN_ENV = "LEVELS_CONV_BN_V5_PLAN"
DGRAD_PLAN_ENV = "LEVELS_CONV_BN_V6_DGRAD_PLAN"
WGRAD_PLAN_ENV = "LEVELS_CONV_BN_V6_WGRAD_PLAN"


def _check_plan(name: str, top_tile: int) -> None:
    raw = os.environ.get(name)
    form = re.compile(rf"(-1|[0-{top_tile}])(,\d{{1,4}})?")
    if raw and not (form.fullmatch(raw.strip()) and int(raw.strip().partition(",")[2] or 0) <= 1024):
        raise ValueError(f"conv_bn: ${name} must be 'TILE' or 'TILE,SPLITS' with TILE in "
                         f"-1..{top_tile} (conv_bn_plan.h's tiles) and SPLITS in 0..1024; got {raw!r}")


def check_plan_env(version: int = 5) -> None:
    """A clear error for a $LEVELS_CONV_BN_V5_PLAN (versions 5 and 6: their forward) or a
    $LEVELS_CONV_BN_V6_DGRAD_PLAN / _WGRAD_PLAN (version 6) the kernels would refuse. Not
    while torch.compile traces (Dynamo of torch 2.11 breaks the graph on re.compile): the
    kernels' own refusal of a bad plan is the error there."""
    if torch.compiler.is_compiling():
        return
    _check_plan(PLAN_ENV, 2)
    if version >= 6:
        _check_plan(DGRAD_PLAN_ENV, 3)
        _check_plan(WGRAD_PLAN_ENV, 2)


OPS = ("conv_bn_eval_fwd", "conv_bn_train_fwd", "conv_bn_eval_bwd", "conv_bn_train_bwd")

_registered = False


def uses_tf32(device, dtype) -> bool:
    # Versions 3 and 4 do not run fp32 on the tensor cores (they fall back to version 2), so
    # every version is exact fp32 arithmetic for fp32 inputs.
    return False


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_CONV_BN if set, else DEFAULT_VERSION (cuda_kernels/versions.py)."""
    return versions.resolve("conv_bn", VERSIONS, DEFAULT_VERSION, version)


def _out_hw(H, W, kH, kW, stride, padding):
    return ((H + 2 * padding[0] - kH) // stride[0] + 1,
            (W + 2 * padding[1] - kW) // stride[1] + 1)


def _ops():
    """torch.ops.levels_cuda, building the library on first use. Once _register() has run
    (build.load() calls it), a plain attribute read: torch.compile traces through it."""
    if _registered or torch.compiler.is_compiling():
        return torch.ops.levels_cuda
    from . import build
    return build.ops()


# ---------------------------------------------------------------------------------------
# Registration: fake implementations.
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


def _fake_bwd(x, w, need_dx):
    C_out = w.shape[0]
    dx = x.new_empty(x.shape) if need_dx else x.new_empty((0,))  # (0,): no dgrad ran
    # dw in w's layout, as the binding allocates it (empty_like)
    return (dx, torch.empty_like(w), x.new_empty((C_out,)), x.new_empty((C_out,)),
            x.new_empty((C_out,)))


def _fake_eval_bwd(dout, x, w, w_folded, bias, running_mean, scale, invstd, stride, padding,
                   version, need_dx=True):
    return _fake_bwd(x, w, need_dx)


def _fake_train_bwd(dout, x, w, w_k, y, mean, invstd, gamma, stride, padding, version,
                    need_dx=True):
    return _fake_bwd(x, w, need_dx)


def _register() -> None:
    """Fake implementations for every kernel op (once per process)."""
    global _registered
    if _registered:
        return
    lib = "levels_cuda::"
    torch.library.register_fake(lib + "conv_bn_eval_fwd", _fake_eval_fwd)
    torch.library.register_fake(lib + "conv_bn_train_fwd", _fake_train_fwd)
    torch.library.register_fake(lib + "conv_bn_eval_bwd", _fake_eval_bwd)
    torch.library.register_fake(lib + "conv_bn_train_bwd", _fake_train_bwd)
    _registered = True


# ---------------------------------------------------------------------------------------
# The entry point (levels/cuda.py calls it after levels.contract.validate_conv_bn).
# ---------------------------------------------------------------------------------------

def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride, padding, eps, momentum, training, version=None):
    """Conv2d then BatchNorm2d; stride and padding as int pairs. Returns (N, C_out, H_out,
    W_out) in channels_last. Training mode updates running_mean/running_var in place.
    What each argument becomes (autograd.cpp), and what it costs: x channels_last (a
    no-op when it already is, one copy of x otherwise), viewed as (N, H, W, C_in), a permute;
    conv_weight viewed as (C_out, kH, kW, C_in): in eval the fold reads it as it lies and
    writes the K-major w' the convolution reads (no copy for any layout); in training the
    convolution reads it K-major, so that the reduction k = (i, j, c) runs along memory (one
    copy of the small weight unless stored that way); its gradient comes back in its own
    layout; the 1-D parameters and buffers contiguous (a copy only for strided views; C_out
    elements)."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"conv_bn: argument 'x' must be float16, bfloat16 or float32 for the CUDA "
                        f"kernels; got {x.dtype}")
    version = resolve_version(version)
    if version >= 5:
        check_plan_env(version)
    return _ops().conv_bn.default(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean,
                                  running_var, [int(s) for s in stride], [int(p) for p in padding],
                                  float(eps), float(momentum), bool(training), version)
