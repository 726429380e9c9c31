"""Level 5 LSTM: the Python side of `lstm.cu` (the recurrence, forward and backward through
time) and `lstm_binding.cpp` (the ops `torch.ops.levels_cuda.lstm_fwd` / `lstm_bwd`).

The design is Level 4's (triton_kernels/lstm.py):
    1. x_t W_ih^T + b_ih does not depend on h, so all T steps are ONE GEMM up front: part A's
       `gemm` (cuda_kernels/mlp.py), fp32 output, B*T rows at once;
    2. the recurrence z_t = xp_t + h_{t-1} W_hh^T + b_hh -> gates -> c_t, h_t runs in this
       level's kernels, one version per idea:

    v1  one fused step kernel per time step   (T launches; W_hh re-read from L2 every step)
    v2  ONE persistent cooperative launch      (each block keeps 32 rows of W_hh — 8 hidden
                                                units x 4 gates; beyond batch 16, 16 units
                                                over batch groups in 16-bit, 4 in fp32 — in
                                                shared memory for all T steps, c in shared
                                                memory; tensor cores for 16-bit, exact fp32
                                                FMAs for fp32; a grid barrier of per-block
                                                release/acquire flags between steps, with
                                                xp_{t+1} prefetched while the others arrive)

    3. backward through time is the same machine run backwards (lstm_bwd: per-step kernels in
       v1, one persistent launch in v2: 16 units a block on the tensor cores in 16-bit, over
       batch groups, 4 units on the CUDA cores in fp32) producing dz (the gate pre-activation gradients of
       every step), dh0 and dc0; everything that does not recur is this level's GEMMs over
       all B*T rows at once: dx = dz W_ih, dW_ih = dz^T x, dW_hh = dz^T h_{t-1}, and the bias
       gradients are column sums of dz.

Why persistence wins at small batch (the launch-bound arithmetic): at B=8, hidden 512 a step
is 2*8*512*2048 = 16.8 MFLOP — 0.02 us of an H100's bf16 tensor cores, ~0.3 us of its fp32
CUDA cores — and W_hh (2 MB bf16) streams from L2 in ~0.4 us. A kernel launch costs several
us (launch latency, scheduling, the drain of the previous kernel), so v1 pays T x several us
for well under T us of math: it is launch-bound. v2 pays one launch, keeps W_hh on chip, and
per step one grid barrier (~1-2 us, a round trip through L2) plus staging h_{t-1} (B*H
elements, 8 KB) from L2 into each block's shared memory.
    Measured on the H100 (2026-11-22, `python scripts/device_level5.py --only lstm` bench; B=8,
    input 256, hidden 512, T=64, forward; nn.LSTM timed in the same run), v2 as first written
    (4 units a block, cooperative_groups' grid.sync()): bf16 v1 0.670 ms (10.5 us/step, 2.47x
    nn.LSTM), v2 0.403 ms (6.3 us/step) = 4.09x nn.LSTM (cuDNN 1.65 ms; goal >= 5x, ~5.1
    us/step); fp32 v1 0.569 ms (2.01x), v2 0.449 ms = 2.55x nn.LSTM (goal >= 1.0x). B=64,
    input 512, hidden 512, T=100: bf16 v2 1.16 ms (2.13x), fp32 v2 2.61 ms (0.97x). Forward
    + backward, bf16, B=8: v2 1.73 ms (2.37x).
    v2 after tuning (8 units a block up to batch 16, the flag barrier split around the xp
    prefetch, cp.async staging; build knobs LEVELS_LSTM_V2_UNITS / _FAT_BATCH / _BARRIER in
    lstm.cu): see reports/h100-level5-attention-lstm.json.
    At a training size (B64, hidden 1024, T64: `levels train --model lstm --preset gpu`) the
    step is bytes through L2, not latency: every block stages its rows of h_{t-1} or dz_{t+1}
    at every step. 16 units a block over batch groups, and the backward on the tensor cores
    (lstm.cu says how), took forward+backward from 6.5 to 2.1 ms (nn.LSTM 3.3-4.2 ms) and the
    model from 0.68x to 1.76-2.15x nn.LSTM's tokens/s (reports/lstm-recurrence/).

Safer than Level 4's barrier: v2 is launched with cudaLaunchCooperativeKernel, its grid sized
from cudaOccupancyMaxActiveBlocksPerMultiprocessor, so all of its blocks are resident at once
BY CONSTRUCTION — if they cannot be, the launch fails with an error; it cannot deadlock the
way a spin barrier over blocks that were never scheduled can (Level 4 needed a timeout and a
NaN poison for that case). The barrier between steps spins on memory (a release/acquire flag
per block), which is safe for exactly that reason. What it costs: v2 needs ceil(hidden/8)
blocks resident at once (ceil(hidden/4) beyond batch 16), each holding its 32 (16) rows of
W_hh and the batch's state, i.e. W_hh must
fit in the GPU's combined shared memory (on an H100 roughly hidden <= 1000 in fp32, <= 1500
in 16-bit; less with a large batch). Where it does not, an explicit version 2 refuses with a
ValueError naming w_hh and pointing at v1 (which works at any size), never a silent slow path
or a wrong answer.

fp32: every product is exact fp32 FMAs on the CUDA cores (v2's tensor cores are for 16-bit
only), so uses_tf32 is False and the fp32 bound (1e-5) applies. The input-projection GEMM
and the backward GEMMs are part A's (`gemm`, its version from LEVELS_CUDA_VERSION_MLP), which
also computes fp32 exactly. c is kept in fp32 at every dtype; dz is stored in the input dtype
(the GEMMs take it so) and the backward recurrence reads it back from there.

Version: the `version` argument, else $LEVELS_CUDA_VERSION_LSTM, else DEFAULT_VERSION (2)
under the PLAN RULE: when the caller chose no version at all, the ops get version 0 (PLAN),
which runs v2 where its plan fits this GPU (all its blocks resident at once, W_hh on chip) and
v1 where it does not — decided per call by v2's launcher from the same occupancy query that
sizes the cooperative launch, before anything runs; forward and backward decide
independently. A version chosen explicitly (argument or environment) is run as chosen: an
explicit 2 that does not fit refuses with the ValueError naming w_hh.
"""

from __future__ import annotations

import os

import torch

from . import mlp, versions

VERSIONS = {
    1: "one fused step kernel per time step (T launches): a warp per (unit, batch row), "
       "W_hh read from L2 every step",
    2: "one persistent cooperative launch: each block keeps 32 rows of W_hh (8 units x 4 "
       "gates; 16 rows beyond batch 16) in shared memory for all steps, a release/acquire flag "
       "barrier between steps; "
       "mma.sync for 16-bit, exact fp32 FMAs for fp32 (the default where its plan fits the "
       "GPU, else v1)",
}
DEFAULT_VERSION = 2
ENV_VERSION = "LEVELS_CUDA_VERSION_LSTM"
PLAN = 0  # the ops' version when the caller chose none: v2 if its plan fits this GPU, else v1

_registered = False


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 recurrences are exact FMAs; part A's GEMMs are exact fp32 too


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_LSTM if set, else DEFAULT_VERSION (cuda_kernels/versions.py)."""
    return versions.resolve("lstm", VERSIONS, DEFAULT_VERSION, version)


def kernel_version(version=None) -> int:
    """The version the ops run: the one chosen (argument, else $LEVELS_CUDA_VERSION_LSTM, checked
    by resolve_version), or PLAN (0) when neither chose: v2 where its plan fits, else v1 (the
    launchers in lstm.cu decide, from the occupancy query that sizes v2's launch)."""
    if version is None and not os.environ.get(ENV_VERSION, "").strip():
        return PLAN
    return resolve_version(version)


def _ops():
    """torch.ops.levels_cuda, building the library on first use. Once _register() has run
    (build.load() calls it), a plain attribute read: torch.compile traces through it."""
    if _registered:
        return torch.ops.levels_cuda
    from . import build

    return build.ops()


# ------------------------------------------------------------------------ registration --

def _fwd_fake(x2, w_ih, b_ih, xp, h0, c0, w_hh, b_hh, time_major, save, version):
    B, H = h0.shape
    rows = x2.shape[0]
    T = rows // B
    gates = xp.new_empty((rows, 4 * H) if save else (0,))
    cs = xp.new_empty((rows, H) if save else (0,))
    return h0.new_empty((B, T, H)), h0.new_empty((B, H)), h0.new_empty((B, H)), gates, cs


def _bwd_fake(dout, dh_n, dc_n, c0, w_hh, gates, cs, time_major, version):
    B, T, H = dout.shape
    return dout.new_empty((B * T, 4 * H)), dout.new_empty((B, H)), dout.new_empty((B, H))


def _register():
    """Fake implementations of both kernel ops; called by build.load() once the library is
    loaded (the ops must exist to be registered against)."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("levels_cuda::lstm_fwd")(_fwd_fake)
    torch.library.register_fake("levels_cuda::lstm_bwd")(_bwd_fake)
    _registered = True


# ----------------------------------------------------------------------- entry point --

def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, version=None):
    """Called by levels.cuda.lstm after the contract's validation. Returns (out (B, T, H),
    (h_n (1, B, H), c_n (1, B, H))) like nn.LSTM(batch_first=True). One op,
    `levels_cuda::lstm` (autograd_binding.cpp), makes of each argument, and what it costs:
      * x: the GEMM's (B*T, I) operand, a view for batch-major or time-major x (the kernels
        take both row orders: a time-major x such as `x_tbi.transpose(0, 1)` is no copy),
        else one copy;
      * w_ih: to the input projection's GEMM as its transposed view (any strides);
      * w_hh: contiguous — the kernels read 16-row slices densely; 4H*H elements, nothing
        when it already is (nn.LSTM's weight);
      * h0, c0: their (B, H) slices contiguous (B*H elements); b_ih, b_hh contiguous (4H).
    The input projection of every step is one GEMM in fp32 before the recurrence, at part
    A's version (LEVELS_CUDA_VERSION_MLP); backward's GEMMs too. The activations for backward
    (gates and c of every step, fp32) are kept only when something requires grad."""
    out, h_n, c_n = _ops().lstm.default(x, h0, c0, w_ih, w_hh, b_ih, b_hh, kernel_version(version),
                                        mlp.resolve_version(None))
    return out, (h_n, c_n)
