"""Level 5 rms_norm: the Python side of `rms_norm.cu` (kernels), `rms_norm_binding.cpp` (the
two kernel ops) and `rms_norm_autograd.cpp` (the op a call is, with its C++ autograd).

The math and the row-in-registers design are Level 4's (triton_kernels/rms_norm.py); the
ladder is layer_norm.cu's with one row reduction instead of two:

    v1  one thread per row                 (the CPU loop, moved to the GPU)
    v2  one warp per row, shuffle sums     (coalesced loads, no shared memory, no barrier)
    v3  16-byte loads, row in registers,   (one read of x, one write of y: the floor;
        a block per wide row                backward fused, dweight in two deterministic stages)
    v4  v3, the backward R rows an          (more bytes in flight per barrier; one barrier,
        iteration                            not three, for R row sums; forward = v3's)

A call is one op, `levels_cuda::rms_norm` (rms_norm_autograd.cpp): it runs the forward op
`levels_cuda::rms_norm_fwd` -> (y, rstd) and records one C++ autograd node whose backward
calls `levels_cuda::rms_norm_bwd` of the SAME version. Both kernel ops have fake (meta)
implementations here, so a compiled or exported graph traces through the call.

Speed (H100, 16384 x 4096, fraction of a copy's bandwidth; `levels bench --component
rms_norm` times every version, reports/rms-norm-v4-2026-11-27/): forward 0.99x (v3's kernel,
which v4 keeps); backward fp32 0.93x (v4) / 0.92x (v3), bf16 0.89x / 0.82x.

Version: the `version` argument, else $LEVELS_CUDA_VERSION_RMS_NORM, else DEFAULT_VERSION (4).
"""

from __future__ import annotations

import torch

from . import versions

VERSIONS = {
    1: "one thread per row: the CPU loop on the GPU (uncoalesced, M threads)",
    2: "one warp per row: coalesced loads, shuffle reductions, no shared memory",
    3: "16-byte vector loads, the row in registers, a block per wide row; fused backward",
    4: "v3, the fused backward R rows an iteration under one barrier (forward: v3's)",
}
# Version 4's rows an iteration R, each forcible through the backward op's `force` argument
# (the tests and scripts/sweep_rms_norm_v4.py check and time every one). A forced R with no
# kernel at a width (R = 4 at 16 elements a thread would spill: rms_norm.cu bwd_v4_kernel),
# or one that cannot run a layout (misaligned rows), is an error, never another kernel.
FORCES = {4: (1, 2, 4)}
V4_KERNELS = {(8, 1), (8, 2), (8, 4), (16, 1), (16, 2)}  # (E elements a thread, R)
DEFAULT_VERSION = 4  # at or above version 3 at every width measured (rms_norm.cu's header)
ENV_VERSION = "LEVELS_CUDA_VERSION_RMS_NORM"

_REGISTERED = False


def uses_tf32(device, dtype) -> bool:
    return False  # no dot products: fp32 math throughout


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_RMS_NORM if set, else DEFAULT_VERSION."""
    return versions.resolve("rms_norm", VERSIONS, DEFAULT_VERSION, version)


# ------------------------------------------------------------------------ registration --

def _fwd_fake(x, weight, eps, version):
    M, N = x.shape
    return x.new_empty((M, N)), x.new_empty((M,), dtype=torch.float32)


def _bwd_fake(dy, x, weight, rstd, version, force=0):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _register():
    """Fake implementations of both kernel ops; called by build.load() once the library is
    loaded (the ops must exist to be registered against)."""
    global _REGISTERED
    if _REGISTERED:
        return
    torch.library.register_fake("levels_cuda::rms_norm_fwd")(_fwd_fake)
    torch.library.register_fake("levels_cuda::rms_norm_bwd")(_bwd_fake)
    _REGISTERED = True


def rms_norm(x, weight, eps=1e-6, version=None):
    """Called by levels.cuda.rms_norm after the contract's validation (CUDA tensors of one
    float dtype, weight (N,)). Returns y with x's shape, contiguous. x becomes its (M, N) row
    view (a copy only when the leading dimensions do not flatten or the last one is
    strided) and weight contiguous (an N-element copy for a strided view), in
    rms_norm_autograd.cpp."""
    if not _REGISTERED and not torch.compiler.is_compiling():
        from . import build
        build.load()  # a direct call (benches, tests): build on first use
    return torch.ops.levels_cuda.rms_norm.default(x, weight, float(eps), resolve_version(version))
