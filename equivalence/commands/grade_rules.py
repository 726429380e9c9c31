"""`levels grade`, a kernel level's rules: credit only for what the submission's own kernels
computed. What runs in a part's process (grade_process._child) while the harness checks it.

A kernel level (Level 4 `triton`, Level 5 `cuda`, and the numba twins `numba`, Level 5's
kernels in Python that numba's simulator runs on a CPU) is judged pass by pass (forward,
backward), and a pass earns nothing when any of these fails:

1. Its own kernels ran: a kernel of the submission's kernel package was launched in that
   pass (Triton: `JITFunction.run` and the interpreter's `run`; numba: the simulator's kernel
   call; CUDA: an op of the compiled extension, counted in the dispatcher, and compiled from
   C++, not registered from Python).
2. Its outputs were written by those kernels, in this call. The level's outputs (and its
   gradients, in the backward) must be, byte for byte, what the submission's kernels stored
   during the call, or copies of such bytes (a cast, a `.contiguous()`, a `torch.cat` of
   kernel outputs). Every store of an interpreted Triton kernel and of a simulated numba
   kernel is recorded (equivalence/interpreter.py; numba's FakeCUDAArray here); every torch
   op that writes memory forgets what it overwrote, unless it copied kernel-written bytes. So
   a token kernel with the answer computed around it, an input handed back, an answer cached
   from an earlier call, all leave outputs no kernel wrote: "out: 1290 of 1290 elements were
   not written by your kernels in this call". Only where the stores can be seen: under
   Triton's interpreter and numba's simulator (on a GPU, compiled kernels' stores are not;
   rules 1, 3, 4 and 5 still hold there).
3. No floating-point arithmetic of torch ran inside the submission's code: the ops that a
   TorchDispatchMode sees while a frame of the submission's packages (levels/,
   triton_kernels/, cuda_kernels/, numba_kernels/) is on the stack may allocate (empty,
   zeros, full), view (reshape, transpose, select...) and copy (clone, .to, cat), and may
   compute on integers and booleans; any other op with a floating-point result is listed
   ("PyTorch computed inside your forward: aten.mean (triton_kernels/layer_norm.py:201),
   ..."). Ops that autograd's engine runs between the student's backward functions (adding
   up gradients, the backward of a view) have no such frame and are not the student's.
4. None of the component's fused ATen ops ran (the card's FUSED_ATEN: the reference in one
   call), whoever called them.
5. No other level's code ran (sys.setprofile on every Python call): another rung's module or
   kernels, the chooser (levels/auto.py), or the grader's own reference (its
   equivalence/cards/).

What it cannot see, said plainly: code run on a thread it did not start (a dispatch mode is
per thread), C++ that computes without dispatching (ATen calls inside a compiled op), and a
compiled kernel's stores on a GPU. The submission runs in the grader's process: these rules
catch what a student would plausibly try, and Gradescope's container per submission and the
course's honour code do the rest.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

KERNEL_LEVELS = ("triton", "cuda", "numba")
# Each rung's own code, relative to the submission: its module, and at a kernel level the
# directory of its kernels. A kernel level may run its own and nothing of the others'.
LEVEL_CODE = {
    "native": ("levels/native.py",),
    "torchscript": ("levels/torchscript.py",),
    "compile": ("levels/compiled.py",),
    "triton": ("levels/triton.py", "triton_kernels"),
    "cuda": ("levels/cuda.py", "cuda_kernels"),
}
# The numba twins as a level of their own (numba_kernels.level, registered as "numba"):
# no rung, but a kernel level whose kernels the other levels must not borrow.
TWIN_CODE = {"numba": ("numba_kernels",)}
# Code of no level that computes the components all the same: the chooser runs whichever
# level it picks.
NO_RUNG_CODE = ("levels/auto.py",)
# The package of a kernel level's kernels, and at Level 5 the namespace of its torch ops:
# cuda_kernels/build.py's OP_NAMESPACE, the TORCH_LIBRARY of every cuda_kernels/*_binding.cpp.
KERNEL_PACKAGE = {"triton": "triton_kernels", "cuda": "cuda_kernels", "numba": "numba_kernels"}
CUDA_OP_NAMESPACE = "levels_cuda"
# The submission's code: where a frame must be for an op to be the student's.
SUBMISSION_PACKAGES = ("levels", "triton_kernels", "cuda_kernels", "numba_kernels")
PASSES = ("forward", "backward")

# Torch ops a kernel level may run itself (rule 3): they allocate, view or copy, and compute
# nothing a kernel should. Anything else with a floating-point result is arithmetic.
VIEW_OPS = frozenset("""view _unsafe_view reshape _reshape_alias as_strided t transpose permute
    expand select slice unsqueeze squeeze split split_with_sizes chunk unbind narrow detach alias
    diagonal unfold movedim lift_fresh _local_scalar_dense set_ resize_ resize_as_ squeeze_
    unsqueeze_ transpose_ t_ as_strided_ view_as_real view_as_complex""".split())
ALLOCATION_OPS = frozenset("""empty empty_like empty_strided new_empty new_empty_strided zeros
    zeros_like new_zeros ones ones_like new_ones full full_like new_full fill_ zero_
    scalar_tensor arange""".split())
COPY_OPS = frozenset("copy_ _to_copy clone contiguous cat _copy_from _copy_from_and_resize".split())
_ALLOWED = VIEW_OPS | ALLOCATION_OPS | COPY_OPS


def other_level_code(level: str) -> tuple[str, ...]:
    """What a kernel `level` must not run (relative to the submission): every other level's
    module and kernel directory (a path without `.py`: every `*.py` in it), and the code of
    no level (NO_RUNG_CODE). Its own module and kernels are not in it."""
    own = {**LEVEL_CODE, **TWIN_CODE}
    if level not in own:
        raise ValueError(f"argument 'level' must be one of {', '.join(own)}; got {level!r}")
    others = [path for name, paths in own.items() if name != level for path in paths]
    return tuple(others) + NO_RUNG_CODE


def _inside(path, root: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(root)


def forbidden_files(roots, level: str, grader: Path | None = None) -> set[str]:
    """The files whose functions `level` must not call: other levels' code in each of
    `roots`, and the grader's reference (its cards), if `grader` is given."""
    forbidden = set()
    for root in roots:
        for rel in other_level_code(level):
            path = Path(root).resolve() / rel
            forbidden |= {str(path)} if rel.endswith(".py") else {str(p) for p in path.glob("*.py")}
    if grader is not None:
        forbidden |= {str(p) for p in (Path(grader).resolve() / "equivalence/cards").glob("*.py")}
    return forbidden


def phase() -> str:
    """The pass running: autograd's current graph task is -1 outside a backward."""
    import torch
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


# ---------------------------------------------------------------------------------------
# Rule 2: the bytes the submission's kernels wrote during a call
# ---------------------------------------------------------------------------------------

_PAGE = 4096


class Written:
    """Which bytes of the process's memory the part's kernels wrote (or torch copied from
    such bytes) since `clear_all()`: a map of 4 KiB pages, one flag per byte (the checked
    shapes are tiny)."""

    def __init__(self):
        self.pages: dict[int, np.ndarray] = {}

    def clear_all(self) -> None:
        self.pages.clear()

    def _set(self, addresses: np.ndarray, value: bool) -> None:
        if not addresses.size:
            return
        page, offset = np.divmod(addresses.astype(np.uint64), np.uint64(_PAGE))
        for p in np.unique(page):
            flags = self.pages.get(int(p))
            if flags is None:
                if not value:
                    continue
                flags = self.pages[int(p)] = np.zeros(_PAGE, dtype=bool)
            flags[offset[page == p].astype(np.int64)] = value

    def mark(self, addresses: np.ndarray, itemsize: int) -> None:
        """Elements of `itemsize` bytes at `addresses` were written by a kernel."""
        self._set(_bytes(addresses, itemsize), True)

    def forget(self, addresses: np.ndarray, itemsize: int) -> None:
        self._set(_bytes(addresses, itemsize), False)

    def covered(self, addresses: np.ndarray, itemsize: int) -> np.ndarray:
        """Per element: were all its bytes written by a kernel?"""
        if not addresses.size:
            return np.ones(0, dtype=bool)
        every = _bytes(addresses, itemsize)
        page, offset = np.divmod(every, np.uint64(_PAGE))
        hit = np.zeros(every.shape, dtype=bool)
        for p in np.unique(page):
            flags = self.pages.get(int(p))
            if flags is not None:
                sel = page == p
                hit[sel] = flags[offset[sel].astype(np.int64)]
        return hit.reshape(addresses.size, itemsize).all(axis=1)


def _bytes(addresses: np.ndarray, itemsize: int) -> np.ndarray:
    addresses = np.asarray(addresses, dtype=np.uint64).reshape(-1)
    return (addresses[:, None] + np.arange(itemsize, dtype=np.uint64)).reshape(-1)


def element_addresses(t, shape=None) -> np.ndarray:
    """The byte address of each element of tensor `t`, in row-major order (broadcast to
    `shape` as an expand would, for the source of a copy)."""
    offsets = np.zeros((), dtype=np.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = offsets[..., None] + np.arange(size, dtype=np.int64) * stride
    if shape is not None and tuple(shape) != tuple(t.shape):
        offsets = np.broadcast_to(offsets, tuple(shape))
    return (np.int64(t.data_ptr()) + offsets.reshape(-1) * t.element_size()).astype(np.uint64)


def _whole_storage(t) -> np.ndarray:
    storage = t.untyped_storage()
    return np.arange(storage.data_ptr(), storage.data_ptr() + storage.nbytes(), dtype=np.uint64)


# numba's simulator: a kernel's element stores land in a FakeCUDAArray (a numpy copy of the
# tensor's memory) and reach the tensor through copy_to_host. Each array remembers which of
# its elements a kernel set; the copy back marks those bytes of the host tensor and forgets
# the others (they were copied from a buffer nobody wrote).
_NUMBA_LISTENERS: list = []
_NUMBA_LOCK = threading.RLock()
_NUMBA_PATCHED = False


def _patch_numba_stores() -> None:
    global _NUMBA_PATCHED
    with _NUMBA_LOCK:
        if _NUMBA_PATCHED:
            return
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        setitem, to_host = FakeCUDAArray.__setitem__, FakeCUDAArray.copy_to_host

        def __setitem__(self, idx, val):
            written = self.__dict__.get("_levels_written")
            if written is None:
                with _NUMBA_LOCK:  # every thread of the block may be first: one mask for all
                    written = self.__dict__.get("_levels_written")
                    if written is None:
                        written = np.zeros(self._ary.shape, dtype=bool)
                        self.__dict__["_levels_written"] = written
            written[idx] = True
            return setitem(self, idx, val)

        def copy_to_host(self, ary=None, stream=0):
            out = to_host(self, ary, stream)
            if _NUMBA_LISTENERS and isinstance(out, np.ndarray) and out.size:
                written = self.__dict__.get("_levels_written")
                mask = (np.zeros(out.shape, dtype=bool) if written is None
                        else np.broadcast_to(written, out.shape))
                offsets = np.zeros((), dtype=np.int64)
                for size, stride in zip(out.shape, out.strides):
                    offsets = offsets[..., None] + np.arange(size, dtype=np.int64) * stride
                addresses = (out.ctypes.data + offsets).astype(np.uint64)
                for listener in list(_NUMBA_LISTENERS):
                    listener(addresses[mask], addresses[~mask], out.itemsize)
            return out

        FakeCUDAArray.__setitem__, FakeCUDAArray.copy_to_host = __setitem__, copy_to_host
        _NUMBA_PATCHED = True


# ---------------------------------------------------------------------------------------
# Rule 1: launches of the submission's kernels, per pass
# ---------------------------------------------------------------------------------------

def count_triton_launches(kernel_dir: Path, launches: dict) -> None:
    """Count launches of the @triton.jit kernels defined under `kernel_dir`, per pass."""
    from triton.runtime import interpreter, jit

    def wrap(cls):
        original = cls.run

        def run(self, *args, **kwargs):
            fn = getattr(self, "fn", None)
            code = getattr(fn, "__code__", None)
            ours = code is not None and _inside(code.co_filename, kernel_dir)
            if ours and not kwargs.get("warmup"):
                key = f"{Path(code.co_filename).stem}.{fn.__name__}"
                ran = launches[phase()]
                ran[key] = ran.get(key, 0) + 1
            return original(self, *args, **kwargs)
        cls.run = run

    wrap(jit.JITFunction)
    wrap(interpreter.InterpretedFunction)


def count_numba_launches(kernel_dir: Path, launches: dict) -> None:
    """Count launches of the numba kernels defined under `kernel_dir`, per pass (numba's
    simulator: a kernel called with a launch configuration; a device function is no launch)."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    original = FakeCUDAKernel.__call__

    def __call__(self, *args):
        code = getattr(self.fn, "__code__", None)
        if not self._device and code is not None and _inside(code.co_filename, kernel_dir):
            key = f"{Path(code.co_filename).stem}.{self.fn.__name__}"
            ran = launches[phase()]
            ran[key] = ran.get(key, 0) + 1
        return original(self, *args)

    FakeCUDAKernel.__call__ = __call__


# "CUDA: registered at /path/binding_all.cpp:112 :: (...) [ boxed unboxed ]", one line per
# dispatch key in torch._C._dispatch_dump; an alias key reads "CompositeExplicitAutograd[alias]".
_REGISTERED_AT = re.compile(r"^(?P<key>\w+)(?:\[alias\])?: registered at (?P<where>.+?:\d+)"
                            r"(?: :: .*)?$", re.MULTILINE)


def kernel_registration(op: str, dispatch_key: str) -> str | None:
    """Where the kernel that runs the op `op` ("ns::name" or "ns::name.overload") for
    `dispatch_key` ("CUDA", "CPU") was registered, "file:line", as the dispatcher recorded
    it: a C++ TORCH_LIBRARY_IMPL names its source file, torch.library called from Python
    the .py file that called it. A composite kernel (every device) if the key has none;
    None if there is neither."""
    import torch

    found = {m["key"]: m["where"] for m in _REGISTERED_AT.finditer(torch._C._dispatch_dump(op))}
    for key in (dispatch_key, "CompositeExplicitAutograd", "CompositeImplicitAutograd"):
        if key in found:
            return found[key]
    return None


class OpCounter:
    """Level 5's rule 1, fed by the dispatch mode: calls of the torch ops of `namespace` (the
    extension's), per pass, into `launches` ({"forward": {op: n}, "backward": {...}}), and
    into `interpreted` ({op: "file.py:line"}) every op whose kernel for `dispatch_key` was
    registered from Python rather than compiled."""

    def __init__(self, namespace: str, dispatch_key: str, launches: dict, interpreted: dict):
        self.namespace, self.dispatch_key = namespace, dispatch_key
        self.launches, self.interpreted = launches, interpreted
        self._seen: set[str] = set()

    def __call__(self, func) -> None:
        if func.namespace != self.namespace:
            return
        schema = func._schema
        op = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        if op not in self._seen:  # the dispatcher's record does not change: read it once
            self._seen.add(op)
            where = kernel_registration(op, self.dispatch_key)
            if where is not None and where.rsplit(":", 1)[0].endswith(".py"):
                self.interpreted[op] = where
        ran = self.launches[phase()]
        ran[schema.name] = ran.get(schema.name, 0) + 1
