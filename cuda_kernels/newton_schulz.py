"""Level 5 newton_schulz: the Python side of `newton_schulz.cu` (kernels) and
`newton_schulz_binding.cpp` (the kernel op, which is the whole call: forward only, no autograd).

The design is Level 4's (triton_kernels/newton_schulz.py): the symmetric products launch the
tiles on and below the diagonal only and mirror each on its store, b*A + c*A^2 and a*X + B X
are GEMMs with the pointwise work in their epilogues, the normalization is a one-element
scale folded into the first step, a tall G is read transposed through its strides. One call
is one op, `levels_cuda::newton_schulz`: 2 + 3 * steps launches from C++.

    v1  shared-memory tiles on the CUDA cores, fp32 accumulation (the first rung: correct,
        not fast; the tensor-core rungs on gemm.cu's main loops are not written yet)

Speed: not measured on a GPU yet. Version: the `version` argument, else
$LEVELS_CUDA_VERSION_NEWTON_SCHULZ, else DEFAULT_VERSION.
"""

from __future__ import annotations

import torch

from . import versions

VERSIONS = {
    1: "shared-memory tiles on the CUDA cores: one triangle of X X^T and of A A, mirrored; "
       "fused epilogues; fp32 accumulation",
}
DEFAULT_VERSION = 1
ENV_VERSION = versions.env_name("newton_schulz")
_registered = False


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 FMAs on the CUDA cores


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_NEWTON_SCHULZ if set, else DEFAULT_VERSION."""
    return versions.resolve("newton_schulz", VERSIONS, DEFAULT_VERSION, version)


def _fake(G, steps, a, b, c, eps, version):
    return G.new_empty(G.shape)


def _register():
    """The kernel op's fake implementation (its shape and dtype, for torch.compile); called by
    build.load() once the library is loaded."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("levels_cuda::newton_schulz")(_fake)
    _registered = True


def newton_schulz(G, steps, a, b, c, eps, version=None):
    """Called by levels.cuda.newton_schulz after the contract's validation (a 2-D CUDA G of a
    float dtype, no grad). Returns a new contiguous tensor in G's shape and dtype."""
    if not _registered and not torch.compiler.is_compiling():
        from . import build
        build.load()  # a direct call (benches, tests): build on first use
    return torch.ops.levels_cuda.newton_schulz.default(G, int(steps), float(a), float(b), float(c),
                                                       float(eps), resolve_version(version))
