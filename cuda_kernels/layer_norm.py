"""Level 5 layer_norm: the Python side of `layer_norm.cu` (kernels) and
`layer_norm_binding.cpp` (the two torch ops).

The math and the reasons for the row-in-registers design are Level 4's
(triton_kernels/layer_norm.py); what Level 5 adds is the ladder that gets there, one idea a
version, each selectable so that `levels bench` can time them side by side:

    v1  one thread per row                 (the CPU loop, moved to the GPU)
    v2  one warp per row, shuffle sums     (coalesced loads, no shared memory, no barrier)
    v3  16-byte loads, row in registers,   (one read of x, one write of y: the floor;
        a block per wide row                backward fused, dw/db in two deterministic stages)

The forward op `levels_cuda::layer_norm_fwd` returns (y, mean, rstd); its backward (registered
here with torch.library.register_autograd) calls `levels_cuda::layer_norm_bwd` of the SAME
version: forward vN pairs with backward vN. Both are torch custom ops with fake (meta)
implementations, so they trace into torch.compile graphs.

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


def _setup_context(ctx, inputs, output):
    x, weight, _bias, _eps, version = inputs
    _y, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.version = version
    ctx.mark_non_differentiable(mean, rstd)  # saved statistics, not outputs of the math


def _backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    # The kernels step through a row by +1: an upstream gradient strided in its last
    # dimension (an expanded `.sum()` gradient has stride 0) is copied, once.
    if dy.stride(-1) != 1:
        dy = dy.contiguous()
    dx, dw, db = torch.ops.levels_cuda.layer_norm_bwd(dy, x, weight, mean, rstd, ctx.version)
    return dx, dw, db, None, None


def _register():
    """Fake implementations of both ops and the forward's autograd; called by build.load()
    once the library is loaded (the ops must exist to be registered against)."""
    global _REGISTERED
    if _REGISTERED:
        return
    torch.library.register_fake("levels_cuda::layer_norm_fwd")(_fwd_fake)
    torch.library.register_fake("levels_cuda::layer_norm_bwd")(_bwd_fake)
    torch.library.register_autograd("levels_cuda::layer_norm_fwd", _backward,
                                    setup_context=_setup_context)
    _REGISTERED = True


def _fwd_op():
    # Eagerly, make sure the library is built and loaded; inside a torch.compile trace it
    # must already be (Dynamo cannot trace the build), and the op is only looked up.
    if not torch.compiler.is_compiling():
        from . import build
        build.load()
    return torch.ops.levels_cuda.layer_norm_fwd


# ----------------------------------------------------------------------- entry point --

def _rows(t: torch.Tensor) -> torch.Tensor:
    """(M, N) with adjacent columns. A view whenever the leading dimensions flatten into one
    row stride (any contiguous tensor, a slice of rows, a slice of columns: no copy); a
    copy (one extra read and write of x) when they do not, or when the last dimension is
    itself strided (a transposed x)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if (t2.stride(-1) == 1 or t2.shape[-1] == 1) else t2.contiguous()


def layer_norm(x, weight, bias, eps=1e-5, version=None):
    """Called by levels.cuda.layer_norm after the contract's validation (CUDA tensors of
    one float dtype, weight and bias (N,)). Returns y with x's shape, contiguous."""
    v = resolve_version(version)
    x2 = _rows(x)
    # weight and bias are read as (N,) vectors, with 16-byte loads in v3: contiguous
    # (free when they already are; an N-element copy otherwise, e.g. a strided slice).
    w = weight.contiguous()
    b = bias.contiguous()
    y, _mean, _rstd = _fwd_op()(x2, w, b, float(eps), v)
    return y.view(x.shape)
