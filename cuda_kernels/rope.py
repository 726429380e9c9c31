"""Level 5 rope: the Python side of `rope.cu` (kernels), `rope.cuh` (the rotation, for any
kernel: attention can apply it to its q and k tiles) and `rope_binding.cpp` (the op).

The math and the layouts are Level 4's (triton_kernels/rope.py). The ladder:

    v1  one thread per pair, a flat index divided into (b, h, n, i) for every pair
    v2  a block per (row block, head), the pair loop in registers, 4 rows a thread with
        their loads issued together (more bytes in flight per thread)
    v3  16-byte vector loads and stores (4 fp32 or 8 bf16/fp16 a load); where the operands
        do not allow vectors (a strided last dimension, misaligned views, D/2 no multiple
        of the vector), v2 runs instead: the same result, slower

A call is one op, `levels_cuda::rope` (autograd.cpp): it runs `levels_cuda::rope_rotate`
and records one C++ autograd node whose backward is `rope_rotate` again with inverse=True:
the rotation by -theta (dx = rotate(dy, cos, -sin)), of the SAME version. No copies: the
kernels read x (q sliced out of a fused qkv buffer, say), dy (an expanded gradient of
stride 0) and the tables through their strides, and write a contiguous y.

Not yet measured on a GPU: `levels bench --component rope` times every version against a
device copy, the eager formula and torch.compile. v3, the default, is compiled (ptxas: no
spills) but has not run: if the GPU tests fail at v3 and pass at v2, set DEFAULT_VERSION = 2.

Version: the `version` argument, else $LEVELS_CUDA_VERSION_ROPE, else DEFAULT_VERSION.
"""

from __future__ import annotations

import torch

from . import versions

VERSIONS = {
    1: "one thread per pair: a flat index divided into (b, h, n, i) for every pair",
    2: "a block per (row block, head), 4 rows a thread, their loads issued together",
    3: "16-byte vector loads and stores (v2 where the operands do not allow vectors)",
}
DEFAULT_VERSION = 3
ENV_VERSION = "LEVELS_CUDA_VERSION_ROPE"

_REGISTERED = False


def uses_tf32(device, dtype) -> bool:
    return False  # no dot products: fp32 math throughout


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_ROPE if set, else DEFAULT_VERSION (cuda_kernels/versions.py)."""
    return versions.resolve("rope", VERSIONS, DEFAULT_VERSION, version)


def _rotate_fake(x, cos, sin, interleaved, inverse, version):
    return x.new_empty(x.shape)  # contiguous, as the op allocates it


def _register():
    """The fake implementation of the kernel op; called by build.load() once the library is
    loaded (the op must exist to be registered against)."""
    global _REGISTERED
    if _REGISTERED:
        return
    torch.library.register_fake("levels_cuda::rope_rotate")(_rotate_fake)
    _REGISTERED = True


def rope(x, cos, sin, interleaved=False, version=None):
    """Called by levels.cuda.rope after the contract's validation (CUDA tensors of one float
    dtype, x (B, H, N, D), cos and sin (N, D/2)). Returns a contiguous (B, H, N, D) tensor."""
    if not _REGISTERED and not torch.compiler.is_compiling():
        from . import build
        build.load()  # a direct call (benches, tests): build on first use
    return torch.ops.levels_cuda.rope.default(x, cos, sin, bool(interleaved),
                                              resolve_version(version))
