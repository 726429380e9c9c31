"""Level 4 in Triton's CPU interpreter, watched: every load and store of a kernel checked
against the memory of the tensors it was handed, and every store reported to whoever listens.

Why. Under TRITON_INTERPRET=1 a kernel is Python and numpy, and its pointers are real host
addresses: `tl.store(y_ptr + offs, y, mask=cols <= N)` writes one element past the end of
`y` into the allocator's own bookkeeping, and the process dies later, somewhere else, with
`corrupted size vs. prev_size` (exit 134) and no word about the kernel. A load past the end
reads garbage, or faults. Guard bytes around each buffer, checked after the call, would
catch some of it too late (the heap is already corrupt, and a wild write may land in another
tensor); checking at the access catches all of it before anything is written, and can say
where: the kernel, the line of the `tl.load`/`tl.store`, the program, the lane, the tensor
and the element.

How. `install()` (idempotent, once per process) wraps two things of triton's interpreter:
- `GridExecutor.__call__`, the launch: before the kernel runs, the tensor arguments it was
  given are noted (name, the bytes of their storage), so an access can be told apart;
- `InterpreterBuilder`'s masked load, masked store and atomics: the addresses of the lanes
  the mask lets through must each lie, with their element's bytes, inside the storage of one
  of the launch's tensors. The storage, not the view: reading a strided view's gaps is no
  crash, and the harness catches it already (the gaps hold NaN, and are compared byte for
  byte after the call).
An access outside them raises OutOfBounds before the access happens.

Stores are also handed to the listeners of `listening(callback)`: callback(addresses,
itemsize), the byte address of every element a kernel wrote (the lanes its mask let
through). The grader uses it to verify that a kernel level's outputs were written by its
kernels (equivalence/commands/grade_rules.py).

Loads and stores both go to the watchers of `watching(callback)`: callback(kind, addresses,
itemsize), kind "load" or "store" (the puzzles of notebook 04a draw from it which elements
a kernel read and wrote: equivalence/puzzles.py).

Nothing changes when the interpreter is off (a GPU): `install()` then does nothing, and
compiled kernels are not watched.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

_LOCK = threading.Lock()
_INSTALLED = False
_LISTENERS: list = []
_WATCHERS: list = []  # callback(kind, addresses, itemsize) for loads and stores
_LAUNCHES = threading.local()  # .stack: the launches running on this thread, innermost last


class OutOfBounds(IndexError):
    """A kernel run by Triton's interpreter loaded or stored outside every tensor it was
    given (the message says which kernel, line, program, lane, tensor and element)."""


@dataclass
class _Buffer:
    name: str  # the kernel's parameter
    start: int  # the first byte of its storage
    end: int  # one past the last byte
    tensor_start: int  # the first byte of the view (data_ptr)
    itemsize: int
    shape: tuple
    dtype: str
    numel: int


@dataclass
class _Launch:
    kernel: str
    file: str
    buffers: list


def active() -> bool:
    """Whether Level 4 runs in Triton's interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def install() -> bool:
    """Watch every interpreted launch of this process from now on (a no-op without the
    interpreter, or when already done). True if the watch is in place."""
    global _INSTALLED
    if not active():
        return False
    with _LOCK:
        if _INSTALLED:
            return True
        from triton.runtime import interpreter

        _wrap_launch(interpreter.GridExecutor)
        _wrap_memory(interpreter.InterpreterBuilder)
        _INSTALLED = True
    return True


@contextlib.contextmanager
def listening(callback):
    """Call `callback(addresses, itemsize)` (a numpy uint64 array of byte addresses) for every
    store of an interpreted kernel while the block runs."""
    install()
    _LISTENERS.append(callback)
    try:
        yield
    finally:
        _LISTENERS.remove(callback)


@contextlib.contextmanager
def watching(callback):
    """Call `callback(kind, addresses, itemsize)` ("load" or "store", a numpy uint64 array of
    the byte addresses the mask let through) for every load and store of an interpreted
    kernel while the block runs."""
    install()
    _WATCHERS.append(callback)
    try:
        yield
    finally:
        _WATCHERS.remove(callback)


def _wrap_launch(cls) -> None:
    original = cls.__call__

    def launch(self, *args, **kwargs):
        import inspect

        # as the launch itself does: launch options (num_warps, ...) are no parameters
        spec = inspect.getfullargspec(self.fn)
        params = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
        try:
            named = inspect.getcallargs(self.fn, *args, **params)
        except TypeError:
            named = {}  # let the launch itself report the wrong arguments
        buffers = [_buffer(name, value) for name, value in named.items()
                   if hasattr(value, "data_ptr") and hasattr(value, "untyped_storage")]
        code = getattr(self.fn, "__code__", None)
        record = _Launch(self.fn.__name__, code.co_filename if code else "", buffers)
        stack = getattr(_LAUNCHES, "stack", None)
        if stack is None:
            stack = _LAUNCHES.stack = []
        stack.append(record)
        try:
            return original(self, *args, **kwargs)
        finally:
            stack.pop()

    cls.__call__ = launch


def _buffer(name: str, t) -> _Buffer:
    t = getattr(t, "base", t) if not hasattr(t, "untyped_storage") else t
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return _Buffer(name, start, start + storage.nbytes(), t.data_ptr(), t.element_size(),
                   tuple(t.shape), str(t.dtype).replace("torch.", ""), t.numel())


def _wrap_memory(cls) -> None:
    load, store = cls.create_masked_load, cls.create_masked_store
    rmw, cas = cls.create_atomic_rmw, cls.create_atomic_cas

    def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        read = _check(ptrs, mask.data, "tl.load")
        if _WATCHERS and read.size:
            for watcher in list(_WATCHERS):
                watcher("load", read, _itemsize(ptrs))
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def masked_store(self, ptrs, value, mask, cache_policy):
        written = _check(ptrs, mask.data, "tl.store")
        out = store(self, ptrs, value, mask, cache_policy)
        _tell(written, ptrs)
        return out

    def atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        written = _check(ptr, mask.data, "an atomic")
        out = rmw(self, rmwOp, ptr, val, mask, sem, scope)
        _tell(written, ptr)
        return out

    def atomic_cas(self, ptr, cmp, val, sem, scope):
        import numpy as np

        written = _check(ptr, np.ones(ptr.data.shape, dtype=bool), "tl.atomic_cas")
        out = cas(self, ptr, cmp, val, sem, scope)
        _tell(written, ptr)
        return out

    cls.create_masked_load, cls.create_masked_store = masked_load, masked_store
    cls.create_atomic_rmw, cls.create_atomic_cas = atomic_rmw, atomic_cas


def _itemsize(ptrs) -> int:
    return max(1, ptrs.get_element_ty().primitive_bitwidth // 8)


def _tell(addresses, ptrs) -> None:
    if addresses is None or not addresses.size:
        return
    size = _itemsize(ptrs)
    for listener in list(_LISTENERS):
        listener(addresses, size)
    for watcher in list(_WATCHERS):
        watcher("store", addresses, size)


def _check(ptrs, mask, what: str):
    """The addresses of the active lanes, after checking them; OutOfBounds if one is outside
    every buffer of the innermost launch."""
    import numpy as np

    stack = getattr(_LAUNCHES, "stack", None)
    addresses = np.broadcast_to(ptrs.data, np.broadcast_shapes(ptrs.data.shape, np.shape(mask)))
    lanes = np.broadcast_to(np.asarray(mask, dtype=bool), addresses.shape)
    active_addresses = addresses[lanes].astype(np.uint64)
    if not stack or not active_addresses.size:
        return active_addresses
    launch = stack[-1]
    size = _itemsize(ptrs)
    inside = np.zeros(active_addresses.shape, dtype=bool)
    for b in launch.buffers:
        inside |= (active_addresses >= b.start) & (active_addresses + size <= b.end)
    if inside.all():
        return active_addresses
    raise OutOfBounds(_message(launch, what, addresses, lanes, inside, size))


def _message(launch: _Launch, what: str, addresses, lanes, inside, size: int) -> str:
    import numpy as np

    outside = np.flatnonzero(~inside)
    first = int(np.flatnonzero(lanes.reshape(-1))[outside[0]])
    lane = tuple(int(i) for i in np.unravel_index(first, addresses.shape)) if addresses.ndim else ()
    address = int(addresses.reshape(-1)[first]) if addresses.ndim else int(addresses)
    where = _kernel_line(launch)
    writes = "writes" if what != "tl.load" else "reads"
    head = (f"out-of-bounds {what} in {launch.kernel}{where}: {len(outside)} lane(s) that the "
            f"mask let through {writes} outside every tensor passed to the kernel; the first, "
            f"lane {list(lane)} of the block, {_relative(address, size, launch.buffers)}")
    from triton.runtime.interpreter import interpreter_builder

    program = tuple(getattr(interpreter_builder, "grid_idx", ()) or ())
    return (f"{head} (program {list(program)}). Check the mask of that {what}: every lane past "
            f"the edge must be masked off (e.g. `cols < N`, not `cols <= N`), and the offsets "
            f"must use the tensor's own strides.")


def _relative(address: int, size: int, buffers: list) -> str:
    """Where `address` is, said against the nearest tensor."""
    below = [b for b in buffers if b.start <= address]
    if below:
        b = max(below, key=lambda b: b.start)
        offset = (address - b.tensor_start) // b.itemsize
        return (f"touches {address + size - b.end} byte(s) "
                f"past the end of {b.name} ({b.dtype}, shape {tuple(b.shape)}, {b.numel} "
                f"elements): element offset {offset} from its first element")
    if buffers:
        b = min(buffers, key=lambda b: b.start)
        return (f"touches {b.start - address} byte(s) before the start of {b.name} ({b.dtype}, "
                f"shape {tuple(b.shape)}): element offset {(address - b.tensor_start) // b.itemsize}")
    return f"touches address {address:#x}, and the kernel was given no tensor"


def _kernel_line(launch: _Launch) -> str:
    """" (file:line: source)" of the kernel's line running now: the innermost frame of the
    kernel's file (the interpreter runs a rewrite of the kernel, compiled with its file name
    and line numbers)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if launch.file and name == launch.file:
            # the whole statement: a store's mask is often on its second line
            line, n = "", frame.f_lineno
            while n < frame.f_lineno + 6:
                line += " " + linecache.getline(name, n).strip()
                n += 1
                if line.count("(") <= line.count(")"):
                    break
            return f" ({Path(name).parent.name}/{Path(name).name}:{frame.f_lineno}: {line.strip()})"
        frame = frame.f_back
    return ""
