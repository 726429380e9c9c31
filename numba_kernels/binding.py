"""The host side of the twins: what cuda_kernels/binding.cpp and the C++ launchers do for
Level 5, for numba's kernels.

A C++ launcher receives raw pointers and element strides; so do the twins. Each tensor is
handed to a kernel as a 1-D array that starts at its first element and ends at its last
(`operand`), with its element strides beside it, and the kernels index
`x[row * stride_xm + col * stride_xn]` exactly as the C++ indexes `x + row * stride_x`. So
every view works without a copy (a row slice, a transposed weight, q/k/v interleaved in one
projection, a stride-0 broadcast gradient), and the gaps between a view's elements are
never read: the harness fills them with NaN, so a kernel that indexed a view as if it were
contiguous would poison its own result.

Why not give numba the 2-D or 4-D view itself: on a GPU it could, but the simulator moves
arguments with numpy copies and refuses buffers that are neither C- nor F-contiguous (a
row-padded slice, a stride-2 vector). The span from first to last element is contiguous in
both worlds.

Memory. Under the simulator, `cuda.to_device` copies the span into a simulated device
buffer (the cudaMemcpy of a real program) and `Output.finish` copies results back into the
torch tensor. On a GPU, torch's memory is handed over as it is, through the CUDA array
interface (`cuda.as_cuda_array`): no copy, and every launch goes on torch's current stream.

Dtypes. The kernels compute and store float32, as Level 5 computes in fp32. float16 and
bfloat16 tensors are upcast by `float32_inputs` (one copy each, differentiable, so autograd
hands gradients back in the input dtype) and results rounded back by the caller: the numbers
Level 5 gets from its element-wise to_f32/from_f32, except that intermediates the C++
stores in the input dtype (the MLP's pre-activation and activation) stay float32 here.
float64 is refused, as at Level 5: no kernel has a float64 path.
"""

from __future__ import annotations

import contextlib
import re
import sys

import torch
from numba import cuda

from . import SIMULATED

HALF_DTYPES = (torch.float16, torch.bfloat16)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def float32_inputs(component: str, named: dict) -> dict:
    """The tensors of `named` as float32 (16-bit ones upcast, float32 ones as they are);
    float64 is a TypeError naming the argument."""
    out = {}
    for name, t in named.items():
        if t.dtype == torch.float32:
            out[name] = t
        elif t.dtype in HALF_DTYPES:
            out[name] = t.float()
        else:
            raise TypeError(f"{component} (numba twin): argument '{name}' must be float32, float16 or "
                            f"bfloat16 (computed in float32, like Level 5's kernels; there is no "
                            f"float64 kernel); got a {t.dtype} tensor of shape {tuple(t.shape)}")
    return out


def span(t: torch.Tensor) -> int:
    """Elements from t's first to its last, gaps included: 1 + sum((size - 1) * stride)."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def operand(t: torch.Tensor):
    """t as a kernel reads it: a 1-D float32 device array over t's span (see the module doc);
    the strides to index it with are t.stride(). Read-only for the kernel."""
    if t.dtype != torch.float32:
        raise TypeError(f"internal: kernels read float32 tensors; got {t.dtype}")
    flat = t.detach().as_strided((span(t),), (1,))
    if SIMULATED:
        return cuda.to_device(flat.numpy())
    return cuda.as_cuda_array(flat)


class Output:
    """A fresh contiguous float32 tensor for a kernel to write (torch.empty: NaN-filled
    under the harness, so an element the kernel forgets stays NaN) and its device array.
    Call `finish()` after the launches, before reading `tensor`."""

    def __init__(self, shape, device):
        self.tensor = torch.empty(shape, dtype=torch.float32, device=device)
        flat = self.tensor.view(-1)
        self.array = cuda.to_device(flat.numpy()) if SIMULATED else cuda.as_cuda_array(flat)

    def finish(self) -> torch.Tensor:
        if SIMULATED:
            self.array.copy_to_host(self.tensor.view(-1).numpy())
        return self.tensor


def dummy(device):
    """A one-element array for a kernel argument that a flag switches off (a null bias):
    numba types every argument, so a kernel cannot take "a pointer or nullptr" as C++ does."""
    return Output((1,), device).array


def launch(kernel, grid, block, *args):
    """kernel[grid, block](*args): on torch's current stream on a GPU; in the simulator at
    once, block after block, with the GIL handed round faster (see _fast_switching)."""
    if SIMULATED:
        with _fast_switching():
            try:
                kernel[grid, block](*args)
            except (AttributeError, ValueError) as exc:
                new = _translated(exc)
                if new is exc:
                    raise
                raise new from exc
        return
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    kernel[grid, block, stream](*args)


# numba's simulator runs a kernel with `cuda` swapped for a fake module of threadIdx,
# syncthreads and the rest, and swaps the real one back when a thread of the block leaves
# the kernel. A thread still running then finds the real `numba.cuda`, which has none of
# them: "module 'numba.cuda' has no attribute 'syncthreads'". On a GPU the same code would
# hang or race at that barrier. (A device function from another module than its kernel met
# the same error on correct code, when its first thread returned before the others:
# simulator.py now counts the threads inside each module's swap.)
_SWAPPED_OUT = re.compile(r"module 'numba\.cuda' has no attribute '(\w+)'")


def _translated(exc: Exception) -> Exception:
    """A simulator artifact said in CUDA's terms (`exc` itself if it is none)."""
    thread = str(exc).split(":", 1)[0] if str(exc).startswith("tid=") else "a thread"
    if isinstance(exc, ValueError) and str(exc).endswith("math domain error"):
        # math.sqrt/log of a negative number: Python raises where a GPU returns NaN
        return RuntimeError(
            f"{thread}: math domain error (numba's simulator runs the kernel as Python, whose "
            f"math.sqrt and math.log raise on a negative number where a GPU returns NaN). The "
            f"value was negative: a variance or sum that came out wrong, often a reduction "
            f"that reads shared memory before every thread wrote it (a missing "
            f"cuda.syncthreads()).")
    found = _SWAPPED_OUT.search(str(exc))
    if found is None:
        return exc
    return RuntimeError(
        f"{thread} used cuda.{found[1]} after other threads of its block had left the kernel "
        f"(numba's simulator said: {exc}). The threads of a block did not all reach the same "
        f"barriers: a cuda.syncthreads() that some threads skip (inside an `if` on threadIdx, "
        f"or after an early `return`) or one that is missing. Every thread of the block must "
        f"pass every barrier; on a GPU this code would hang or race there.")


# The simulator runs a block as one OS thread per CUDA thread, and its block manager
# busy-polls them (in Python, holding the GIL) to release a barrier once all have arrived.
# Python hands the GIL to another thread only every "switch interval", 5 ms by default, so
# a barrier of 32 threads can cost tens of milliseconds of waiting. 0.1 ms measured about
# 2x faster on the layer_norm twin (2 cores). The interval is process-wide: it is set for
# the duration of a launch only, and restored.
SIMULATOR_SWITCH_INTERVAL_S = 1e-4


@contextlib.contextmanager
def _fast_switching():
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SIMULATOR_SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)
