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
"""

from __future__ import annotations

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


def install() -> bool:
    """Patch FakeCUDAShared.array (idempotent). True if the patch is in place."""
    global _INSTALLED, _ORIGINAL
    if _INSTALLED:
        return True
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
