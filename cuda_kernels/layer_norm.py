"""Level 5 layer_norm: the Python side of `layer_norm.cu` (kernels) and
`layer_norm_binding.cpp` (the two torch ops).

The math and the reasons for the row-in-registers design are Level 4's
(triton_kernels/layer_norm.py); what Level 5 adds is the ladder that gets there, one idea a
version, each selectable so that `levels bench` can time them side by side:

    v1  one thread per row                 (the CPU loop, moved to the GPU)
    v2  one warp per row, shuffle sums     (coalesced loads, no shared memory, no barrier)
    v3  16-byte loads, row in registers,   (one read of x, one write of y: the floor;
        a block per wide row                backward fused, dw/db in two deterministic stages)
    v4  v3 at every width and layout:      (the kernel picked by a rule, layer_norm_plan.h:
        lane groups, a block, or a          element loads still keep the row in registers;
        cluster of blocks per row           rows wider than a block split over a cluster)
    v5  v3's forward where it is fastest,  (more bytes in flight per barrier, one barrier for
        v4's elsewhere; the backward R      2R row sums: rms_norm.cu's version 4 with layer
        rows an iteration                   norm's two sums)
    v6  v5, and for rows too wide for one  (the next rows' pieces always on their way: no
        block's registers a ring of         registers held, no barrier leaves DRAM idle;
        shared-memory buffers the copy      sm_90, 16-byte rows, up to 3 blocks an SM)
        engine (TMA) fills rows ahead

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

Version: the `version` argument, else $LEVELS_CUDA_VERSION_LAYER_NORM, else the measured rule
(version 6 for rows of 256 columns or more, version 4 for narrower ones), which the op applies in
C++; version 6 then picks its kernel there from x's width and address (Python reading
data_ptr() would break torch.compile's trace).
"""

from __future__ import annotations


import torch

from . import versions

VERSIONS = {
    1: "one thread per row: the CPU loop on the GPU (uncoalesced, M threads)",
    2: "one warp per row: coalesced loads, shuffle reductions, no shared memory",
    3: "16-byte vector loads, the row in registers, a block per wide row; fused backward",
    4: "v3 at every width and alignment: lane groups / a block / a cluster per row, by a rule",
    5: "v3's forward where it runs fastest (v4's elsewhere); backward R rows an iteration",
    6: "v5, with wide rows through shared memory by the copy engine (TMA), rows in flight",
}
DEFAULT_VERSION = 6  # where default_version's rule does not pick version 4
# Version 4's kernels, each forcible through the ops' `path` argument (the tests and
# scripts/sweep_layer_norm.py time and check every one; layer_norm_plan.h's LnPath, + 4 for
# element loads where 16-byte ones would do). A forced path that cannot run a size is an
# error ("does not support these sizes or layouts"), never another path.
PATHS = {4: {1: "rows in registers (lane groups or a block per row)",
             2: "a row split over a cluster of blocks (sm_90)",
             3: "v3's loop forward / v2's backward",
             4: "the rule's choice, element loads",
             5: "rows in registers, element loads",
             6: "split over a cluster, element loads",
             7: "v3's loop by elements / v2's backward"},
         6: {1: "the copy-engine kernel at any width and alignment (sm_90)"}}
ENV_VERSION = "LEVELS_CUDA_VERSION_LAYER_NORM"

_REGISTERED = False


def uses_tf32(device, dtype) -> bool:
    return False  # no dot products: fp32 math throughout


RULE = 0  # the ops' version 0: the measured rule below, applied in C++ at the launch


def default_version(x=None) -> int:
    """The version a call runs when nobody chose one: version 6 for rows of 256 columns or
    more (version 5, which is version 4 wherever rows do not load as 16-byte vectors, and
    version 6's copy-engine kernels for the widest rows, aligned or not), version 4 for
    narrower rows (measured: layer_norm_plan.h ln_default_version and ln_v6_bulk have the
    figures). The ops apply the rule themselves (version 0); this is its mirror for the
    bench and the tests, which check that both agree (tests/test_cuda_layer_norm.py)."""
    if x is None:
        return DEFAULT_VERSION
    return 4 if x.shape[-1] < 256 else DEFAULT_VERSION


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_LAYER_NORM if set, else RULE (0), which the ops
    resolve per call to default_version's choice (cuda_kernels/versions.py)."""
    return versions.resolve("layer_norm", VERSIONS, RULE, version)


# ------------------------------------------------------------------------ registration --

def _fwd_fake(x, weight, bias, eps, version, path=0):
    M, N = x.shape
    return (x.new_empty((M, N)), x.new_empty((M,), dtype=torch.float32),
            x.new_empty((M,), dtype=torch.float32))


def _bwd_fake(dy, x, weight, mean, rstd, version, path=0):
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


def layer_norm(x, weight, bias, eps=1e-5, version=None, path=0):
    """Called by levels.cuda.layer_norm after the contract's validation (CUDA tensors of one
    float dtype, weight and bias (N,)). Returns y with x's shape, contiguous. What each
    argument becomes (autograd_binding.cpp): x its (M, N) row view (a copy only when the
    leading dimensions do not flatten or the last one is strided), weight and bias
    contiguous (an N-element copy for a strided view). path: 0, or one of PATHS[version]
    (forced: the tests and the sweep)."""
    if not _REGISTERED and not torch.compiler.is_compiling():
        from . import build
        build.load()  # a direct call (benches, tests): build on first use
    return torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),
                                                    resolve_version(version), int(path))
