"""Level 5 layer_norm: the Python side of `layer_norm.cu` (kernels) and
`layer_norm_binding.cpp` (the two torch ops).

The math and the reasons for the row-in-registers design are Level 4's
(triton_kernels/layer_norm.py); what Level 5 adds is the ladder that gets there, one idea a
version, each selectable so that `levels bench` can time them side by side:

    v1  one thread per row                 (the CPU loop, moved to the GPU)
    v2  one warp per row, shuffle sums     (coalesced loads, no shared memory, no barrier)
    v3  16-byte loads, row in registers,   (one read of x, one write of y: the floor;
        a block per wide row                backward fused, dw/db in two deterministic stages)

A call is one op, `levels_cuda::layer_norm` (autograd_binding.cpp): it runs the forward op
`levels_cuda::layer_norm_fwd` -> (y, mean, rstd) and records one C++ autograd node whose
backward calls `levels_cuda::layer_norm_bwd` of the SAME version: forward vN pairs with
backward vN. Both kernel ops have fake (meta) implementations here, so a compiled or
exported graph traces through the call.

Measured on an H100 at 16384x4096 during development (kernel time; the table per version is
in layer_norm.cu; not yet in a committed report: `levels bench --component layer_norm` makes one):
v3 forward 2.93 TB/s fp32 (0.99x a device copy, 0.99x torch.compile), 2.83 TB/s bf16 (0.98x,
1.12x); backward 2.64 TB/s fp32 (0.89x copy, 1.05x compile), 2.11 TB/s bf16 (0.73x, 1.05x).
v1 is 10-40x slower than v3, v2 2-3x.

Version: the `version` argument, else $LEVELS_CUDA_VERSION_LAYER_NORM, else DEFAULT_VERSION.
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
ENV_VERSION = "LEVELS_CUDA_VERSION_LAYER_NORM"

_REGISTERED = False


def uses_tf32(device, dtype) -> bool:
    return False  # no dot products: fp32 math throughout


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_LAYER_NORM if set, else DEFAULT_VERSION (cuda_kernels/versions.py)."""
    return versions.resolve("layer_norm", VERSIONS, DEFAULT_VERSION, version)


# ------------------------------------------------------------------------ registration --

def _fwd_fake(x, weight, bias, eps, version):
    M, N = x.shape
    return (x.new_empty((M, N)), x.new_empty((M,), dtype=torch.float32),
            x.new_empty((M,), dtype=torch.float32))


def _bwd_fake(dy, x, weight, mean, rstd, version):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


def _register():
    """Fake implementations of both kernel ops; called by build.load() once the library is
    loaded (the ops must exist to be registered against)."""
    global _REGISTERED
    if _REGISTERED:
        return
    torch.library.register_fake("levels_cuda::layer_norm_fwd")(_fwd_fake)
    torch.library.register_fake("levels_cuda::layer_norm_bwd")(_bwd_fake)
    _REGISTERED = True


def layer_norm(x, weight, bias, eps=1e-5, version=None):
    """Called by levels.cuda.layer_norm after the contract's validation (CUDA tensors of one
    float dtype, weight and bias (N,)). Returns y with x's shape, contiguous. What each
    argument becomes (autograd_binding.cpp): x its (M, N) row view (a copy only when the
    leading dimensions do not flatten or the last one is strided), weight and bias
    contiguous (an N-element copy for a strided view)."""
    if not _REGISTERED and not torch.compiler.is_compiling():
        from . import build
        build.load()  # a direct call (benches, tests): build on first use
    return torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),
                                                    resolve_version(version))
