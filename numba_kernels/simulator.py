"""A fix to numba's CUDA simulator that the twins need: shared arrays allocated once per block.

The bug. Under the simulator every CUDA thread of a block is an OS thread, and
`cuda.shared.array(shape, dtype)` is one Python dict per launch, keyed by the calling line:
the first thread to reach the line allocates the array, every later thread gets the same
one. numba (0.60-0.68, `numba/cuda/simulator/kernelapi.py`, FakeCUDAShared.array) does that
as look-up, then allocate, then insert, with no lock. Two threads that reach the line
together can both miss the look-up and each allocate an array: a thread left holding the
orphan stages its element where nobody reads it, and the others read an uninitialised slot
of the real tile. On a GPU this cannot happen (shared memory is one allocation per block,
made before any thread runs); in the simulator it is a wrong answer a few times in a hundred
launches, depending on how the OS schedules threads. It was seen as a flaky exercise in
notebook 05 (a tiled GEMM whose gradients were off by 8% in one CI run out of six), and
tests/test_numba_twins.py reproduces it on the unpatched method.

The fix: the same look-up-or-allocate under a lock. The key is computed as numba does (the
caller's file and line), but from the caller's frame directly, which is also much cheaper
than numba's full `traceback.extract_stack` on every call. Dynamic shared memory
(shape 0) has no key and is left to numba.

`install()` runs once, when numba_kernels is imported with the simulator on. It refuses to
patch a numba whose simulator no longer has the method it replaces (a newer numba may have
fixed or moved it): the twins then run on the unpatched simulator and say so.

A second race, in a device function that lives in another module than its kernel (a
notebook's exercise, e.g. notebook 05's `my_block_sum`). The simulator runs a kernel with
the `cuda` name in the kernel's module swapped for a fake module (threadIdx, syncthreads,
...), once for the whole launch. A device function swaps `cuda` in *its own* module at every
call, per thread (numba's `swapped_cuda_module`): the first thread to enter replaces the real
module, and when that thread returns it puts the real one back, while other threads of the
block may still be inside the function. Their next `cuda.threadIdx` finds the real
`numba.cuda`, which has none: "module 'numba.cuda' has no attribute 'threadIdx'" (seen once
in CI, in notebook 05, on correct code). The fix counts the threads inside per module: the
first in swaps, the last out restores (`_swapped_cuda_module`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings

import numpy as np
from numba.core import types
from numba.np import numpy_support

_LOCK = threading.Lock()
_INSTALLED = False


def _shared_array(self, shape, dtype):
    """FakeCUDAShared.array, with the look-up and the insert made one atomic step."""
    if shape == 0:
        return _ORIGINAL(self, shape, dtype)
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)
    with _LOCK:
        array = self._allocations.get(key)
        if array is None:
            array = np.empty(shape, dtype)
            self._allocations[key] = array
    return array


_ORIGINAL = None

# id(a module's globals) -> [threads inside a swapped region, the names it swapped and their values]
_SWAPS: dict = {}


@contextlib.contextmanager
def _swapped_cuda_module(fn, fake_cuda_module):
    """numba's swapped_cuda_module, counted per module: `cuda` in fn's module is the fake
    from the first thread in until the last thread out, not until the first one out."""
    from numba import cuda
    globs = fn.__globals__
    with _LOCK:
        entry = _SWAPS.get(id(globs))
        if entry is None:
            names = {k: v for k, v in globs.items() if v is cuda}
            globs.update({k: fake_cuda_module for k in names})
            entry = _SWAPS[id(globs)] = [0, names]
        entry[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                globs.update(entry[1])
                del _SWAPS[id(globs)]


def _install_counted_swap() -> bool:
    try:
        from numba.cuda.simulator import kernel
    except ImportError:
        return False
    if not hasattr(kernel, "swapped_cuda_module"):
        warnings.warn("numba_kernels: this numba's CUDA simulator has no swapped_cuda_module "
                      "(numba_kernels/simulator.py patches it); running it unpatched, so a device "
                      "function from another module than its kernel may rarely see the real "
                      "numba.cuda mid-call", RuntimeWarning, stacklevel=3)
        return False
    kernel.swapped_cuda_module = _swapped_cuda_module
    return True


def install() -> bool:
    """Patch FakeCUDAShared.array and the simulator's module swap (idempotent). True if the
    shared-array patch is in place."""
    global _INSTALLED, _ORIGINAL
    if _INSTALLED:
        return True
    _install_counted_swap()
    try:
        from numba.cuda.simulator.kernelapi import FakeCUDAShared
    except ImportError:
        FakeCUDAShared = None
    if FakeCUDAShared is None or not hasattr(FakeCUDAShared, "array") \
            or not hasattr(FakeCUDAShared(0), "_allocations"):
        warnings.warn("numba_kernels: this numba's CUDA simulator does not have the shared-array "
                      "code the twins patch (numba_kernels/simulator.py); running it unpatched, so "
                      "a tiled kernel may rarely read a tile another thread never wrote",
                      RuntimeWarning, stacklevel=2)
        return False
    _ORIGINAL = FakeCUDAShared.array
    FakeCUDAShared.array = _shared_array
    _INSTALLED = True
    return True


def original_shared_array():
    """numba's own FakeCUDAShared.array (for the test that shows the race)."""
    return _ORIGINAL
