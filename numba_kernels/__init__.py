"""Level 5 on a CPU: numba.cuda twins of the CUDA C++ kernels, run by numba's CUDA simulator.

Level 5 (cuda_kernels/*.cu) only runs on an NVIDIA GPU. The kernels here are written in
numba's CUDA dialect of Python and mirror the C++ ones line for line: the same grid and
block shapes, the same blockIdx/threadIdx arithmetic, the same shared-memory tiles and
barriers, the same epilogues. Two ways to run them:

  * on a CPU, under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): every CUDA thread of a
    block is an OS thread running the kernel's Python source, blocks run one after another.
    Correct CUDA semantics for what the twins use (shared memory, cuda.syncthreads, local
    arrays), at roughly a million times a GPU's time: tiny shapes only;
  * on an NVIDIA GPU (no simulator): numba compiles the same source to PTX.

    layer_norm.py   layer_norm.cu: block-per-row forward, dx, two-stage dweight/dbias
    rms_norm.py     rms_norm.cu, built as layer_norm.py: one row reduction, dweight only
    gemm.py         gemm.cu version 2 (32x32 shared-memory tiles, fused epilogue) and
                    column_sum; the MLP composed from them as cuda_kernels/mlp.py does
    attention.py    flash attention (the algorithm of triton_kernels/attention.py) as a
                    CUDA kernel: a thread per query row, K/V tiles in shared memory
    rope.py         rope.cu version 2: a block per (row block, head), strided reads
    binding.py      the host side (binding.cpp's job): torch tensors -> kernel arguments
    level.py        the five-function face the harness checks: levels.register("numba",
                    numba_kernels.level), or check("layer_norm", fn=level.layer_norm)
    simulator.py    two fixes to numba's simulator, installed on import when it is on: a
                    lock for its shared memory (a race that gave a tile two copies), and
                    a counted swap of `cuda` for a device function of another module
    ptx.py          every twin compiled to PTX for a real GPU, without one (libNVVM only):
                    NUMBA_ENABLE_CUDASIM=0 python -m numba_kernels.ptx

Which numba: the CUDA target built into numba (`numba.cuda`, numba >= 0.60, < 0.69; the
tests pass with 0.60.0 and 0.68.1), because it carries the simulator and installs as a plain
wheel with no CUDA toolkit. numba deprecates it in favour of NVIDIA's `numba-cuda` package,
documented with the same `from numba import cuda` API and its own simulator (not tried
here); the upper bound keeps a numba that may drop the built-in target out until then.

The simulator is chosen when numba is imported, never later. So importing this package
switches it on (sets NUMBA_ENABLE_CUDASIM=1) on a machine without a CUDA GPU, unless numba
was imported before; `unavailable_reason` says what a process cannot run and why.
"""

from __future__ import annotations

import os
import sys

import torch

# Must happen before `numba` is imported anywhere: numba reads it once, at import.
NUMBA_IMPORTED_TOO_EARLY = "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1"
if not torch.cuda.is_available() and "numba" not in sys.modules:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from numba import config as _numba_config  # after the switch above, on purpose

SIMULATED: bool = bool(_numba_config.ENABLE_CUDASIM)

if SIMULATED:
    # numba's simulator can hand two threads of one block two different shared arrays
    # (an unlocked check-then-insert), and a device function of another module the real
    # numba.cuda mid-call: simulator.py says how each was found, and fixes it.
    from . import simulator as _simulator
    _simulator.install()


def unavailable_reason(device) -> str | None:
    """None if the twins can run on tensors of `device` in this process, else why not."""
    device = torch.device(device)
    if device.type == "cpu":
        if SIMULATED:
            return None
        return ("the numba twins run CPU tensors only under numba's CUDA simulator, and numba was "
                "imported without it (NUMBA_ENABLE_CUDASIM is not 1"
                + (", and numba was imported before numba_kernels" if NUMBA_IMPORTED_TOO_EARLY else "")
                + "): start Python with NUMBA_ENABLE_CUDASIM=1, or import numba_kernels first")
    if device.type == "cuda":
        if SIMULATED:
            return ("numba's CUDA simulator is on in this process (NUMBA_ENABLE_CUDASIM=1): the "
                    "twins take CPU tensors; run a process without it to use the GPU")
        from numba import cuda
        if not cuda.is_available():
            return "numba.cuda finds no usable CUDA GPU/driver here (numba.cuda.is_available() is False)"
        return None
    return f"the numba twins run on cpu (simulated) or cuda tensors; got device {device}"


__all__ = ["SIMULATED", "unavailable_reason"]
