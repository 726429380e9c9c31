"""Level 5 rms_norm: the Python side of `rms_norm.cu` (kernels), `rms_norm_binding.cpp` (the
two kernel ops) and `rms_norm_autograd.cpp` (the op a call is, with its C++ autograd).

The math and the row-in-registers design are Level 4's (triton_kernels/rms_norm.py); the
ladder is layer_norm.cu's with one row reduction instead of two:

    v1  one thread per row                 (the CPU loop, moved to the GPU)
    v2  one warp per row, shuffle sums     (coalesced loads, no shared memory, no barrier)
    v3  16-byte loads, row in registers,   (one read of x, one write of y: the floor;
        a block per wide row                backward fused, dweight in two deterministic stages)

A call is one op, `levels_cuda::rms_norm` (rms_norm_autograd.cpp): it runs the forward op
`levels_cuda::rms_norm_fwd` -> (y, rstd) and records one C++ autograd node whose backward
calls `levels_cuda::rms_norm_bwd` of the SAME version. Both kernel ops have fake (meta)
implementations here, so a compiled or exported graph traces through the call.

Speed: not yet measured on a GPU; `levels bench --component rms_norm` times every version.

Version: the `version` argument, else $LEVELS_CUDA_VERSION_RMS_NORM, else DEFAULT_VERSION.
"""

from __future__ import annotations

import torch

from . import versions

VERSIONS = {
    1: "one thread per row: the CPU loop on the GPU (uncoalesced, M threads)",
    2: "one warp per row: coalesced loads, shuffle reductions, no shared memory",
    3: "16-byte vector loads, the row in registers, a block per wide row; fused backward",
}
DEFAULT_VERSION = 3
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


def _bwd_fake(dy, x, weight, rstd, version):
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
