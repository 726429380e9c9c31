"""Level 4's host path: record a call's launches once per argument signature, replay them in C++.

Why (the numbers are in replay.cpp's header): a Level 4 call ran Python around its kernels:
autograd.Function.apply, the launcher's choices and allocations, one Python launch per
kernel, and a backward that the autograd engine had to hand to Python. Forward+backward
cost 300-430 us more host time than eager PyTorch, which decided whole models (a GPT step:
20 ms of GPU work, 47-65 ms on the wall).

What it does: for one argument signature (each tensor's shape, strides, dtype, device,
requires_grad and 16-byte alignment; every other argument by value: levels.contract's
`signature`) the Python path always makes the same decisions, so `call` records them once:

1. **record** (`_record`): a dry pass of the Function's forward, then of its backward on
   gradients shaped like its outputs, in which `launch` runs no kernel but notes each one
   (kernel, grid, arguments), and a dispatch mode notes every torch operation. Only
   allocations, views and fills may happen between launches; anything else (a copy, a sum,
   `.item()`) means the signature stays on the Python path, and `reasons()` says why.
2. **plan** (`_plan`): every tensor the launches saw is located: in one of the call's
   inputs (at a byte offset), in a buffer the forward or the backward allocated, or in an
   output's gradient. Each launch becomes the compiled kernel's CUfunction, its grid, block
   and shared memory, and its parameters in the kernel's own order (a pointer as base +
   offset, the integers and floats as their bytes).
3. **replay** (`replay.cpp`): allocate the same buffers, patch the pointers, cuLaunchKernel;
   one C++ autograd node keeps what the backward reads, and its backward runs the backward's
   launches on the engine's thread, Python never entered. (The driver API launches into the
   calling thread's current CUDA context, which the runtime binds at a thread's first call
   and the driver does not: the replay binds the device's primary context itself. Without
   that, a replayed backward that was the first CUDA work of the engine's thread crashed:
   tests/test_replay.py's fresh-thread test, reports/amp-host-path/.)

The first call of a signature runs the Python path right after its dry pass (it compiles
the kernels, the backward's included, which the plan needs loaded), then the plan is built;
every later call replays. A call that computes no gradient is recorded and replayed the same
way without a node (`call_forward`, from launch.forward_ahead). Measured on an H200 host
(reports/host-path-replay/, `levels bench --overhead` with and without): forward+backward of
a tiny call 247-837 us -> 116-302 us, at most eager's + 22 us in that run (rms_norm + 65 us
on another host); the GPT of
`levels train --preset gpu` 28.6 -> 24.9 ms a step for 21-22 ms of GPU work.

What it costs and what it does not cover: a C++ library built once per torch version (g++
only, no CUDA toolkit: ~40 s cold, cached in ~/.cache/levels/triton); it follows Triton's
kernel calling convention (pointers, i32/i64, fp32/fp64 parameters, two scratch pointers
after them), and refuses kernels that need anything else (scratch memory, clusters,
cooperative or PDL launches, tensor descriptors), which then run as before; replay.cpp also
asks the driver for each kernel's parameter sizes once and refuses a plan that differs. Not
replayed: calls under torch.compile (Dynamo traces the kernels), during a CUDA-graph capture
(the dry pass would be captured), with launch hooks installed (profilers), and in Triton's CPU
interpreter. (The persistent LSTM once watched its barrier's error word from the host inside
its Function, which kept it on the Python path; it now reports through a word passed as an
input, triton_kernels/lstm.py `_sticky`, and replays like the rest.)
`LEVELS_TRITON_REPLAY=0` switches it off, to compare.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import operator
import os
import struct
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import launch as _launch

ENABLED = os.environ.get("LEVELS_TRITON_REPLAY", "1") != "0"
SOURCE = Path(__file__).with_name("replay.cpp")
EXT_NAME = "levels_triton_replay"

# c10::ScalarType's numbers (stable since torch 1.x); a dtype not here is refused
SCALAR_TYPES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
                torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bool: 11,
                torch.bfloat16: 15}

INPUT, TEMP, SAVED, GRAD = 0, 1, 2, 3
LAUNCH, FILL, COPY = 0, 1, 2
PTR, NULLPTR, I32, I64, F32, F64 = range(6)

# torch operations a recorded call may make between its launches: they allocate or view
# memory, which the plan reproduces; fills are replayed as steps. Anything else computes
# (or reads a value back), which a replay of launches alone would skip.
ALLOCATE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
VIEW = {"view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "select", "slice",
        "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "detach", "alias",
        "split", "split_with_sizes", "unbind", "narrow", "unflatten", "view_as", "lift_fresh",
        "diagonal", "movedim", "chunk"}
FILLS = {"fill_", "zero_"}
COPIES = {"copy_": 0, "clone": None, "_to_copy": None}  # into args[0], or into a new tensor
ZEROS = {"zeros", "new_zeros", "zeros_like"}            # an allocation, then a fill of 0
FULLS = {"full": 1, "new_full": 2, "full_like": 1}      # ... of the value at this position
METADATA_PREFIXES = ("sym_", "is_", "size", "stride", "dim", "numel", "storage_offset")


class Refused(Exception):
    """Why a signature cannot be replayed (it runs on the Python path, as before)."""


def _no_signature(args) -> None:
    return None  # nothing replays until a level installs its signature


_signature = _no_signature


def install(signature) -> None:
    """Switch the replay on in this process. `signature(args)` is a call's key: levels.triton
    installs the contract's (levels.contract.signature: each tensor's shape, strides, dtype,
    device, requires_grad and 16-byte alignment, every other argument by value; None for a
    call that must not be served from a table). The kernels do not import the levels layer:
    the level hands it down when it loads its first kernels."""
    global _signature
    _signature = signature
    _launch._replay = sys.modules[__name__]


# ---------------------------------------------------------------------------------------
# The library
# ---------------------------------------------------------------------------------------

_LOCK = threading.Lock()
_STATE: dict = {"ops": None, "error": None, "loaded": None}


def cache_dir() -> Path:
    """Where the library is built: beside Level 5's builds, keyed by torch and Python."""
    from cuda_kernels import build

    key = f"{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}"
    return build.cache_root() / "level4-host-path" / key


def load():
    """The library's ops (torch.ops.levels_triton), built on first use; None (and the
    reason in `unavailable()`) if it cannot be built here."""
    ops = _STATE["ops"]
    if ops is not None or _STATE["error"] is not None:
        return ops
    with _LOCK:
        if _STATE["ops"] is None and _STATE["error"] is None:
            try:
                _STATE["ops"] = _build()
            except Exception as exc:  # noqa: BLE001 - reported: the Python path stays
                _STATE["error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
                warnings.warn(f"levels: Level 4's C++ host path is unavailable, calls launch "
                              f"from Python (slower host path, same kernels and results): "
                              f"{_STATE['error']}", RuntimeWarning, stacklevel=3)
    return _STATE["ops"]


def unavailable() -> str | None:
    """Why the replay path is off in this process, or None while it is usable."""
    if not ENABLED:
        return "LEVELS_TRITON_REPLAY=0"
    if _launch.INTERPRETED:
        return "Triton's CPU interpreter (TRITON_INTERPRET=1) runs the kernels in Python"
    return _STATE["error"]


def _build():
    """Build (or find built) and load the library; once per process: a second library
    registering the same torch.ops namespace would abort the process."""
    if _STATE["loaded"] is not None:
        return torch.ops.levels_triton
    import logging

    from torch.utils import cpp_extension

    from cuda_kernels import build

    directory = build.private_dir(cache_dir())
    text = SOURCE.read_text()

    def builder(where: Path, verbose: bool) -> str:
        kwargs = dict(name=EXT_NAME, cpp_sources=[text], extra_cflags=["-O2"],
                      build_directory=str(where), verbose=verbose, with_cuda=False,
                      is_python_module=False)
        if "no_implicit_headers" in inspect.signature(cpp_extension.load_inline).parameters:
            kwargs["no_implicit_headers"] = True
        logger = logging.getLogger("torch.utils.cpp_extension")
        level = logger.level
        if not verbose:
            logger.setLevel(logging.ERROR)
        try:
            return str(cpp_extension.load_inline(**kwargs))
        except RuntimeError as exc:
            raise build.BuildError(build.format_build_error(str(exc), where, None, None,
                                                            rebuild_hint=False,
                                                            what="Level 4's host path")) from None
        finally:
            logger.setLevel(level)

    stamp = hashlib.sha256(text.encode()).hexdigest()[:16]
    build.run_build(directory, builder, stamp=stamp, what="Level 4's C++ host path",
                    library=directory / f"{EXT_NAME}.so")
    _STATE["loaded"] = str(directory)
    return torch.ops.levels_triton


# ---------------------------------------------------------------------------------------
# Recording: the dry pass
# ---------------------------------------------------------------------------------------

class _OpLog(TorchDispatchMode):
    """Notes the torch operations of a dry pass into `events` (fills, in order with the
    launches) and `refused` (what a replay could not reproduce)."""

    def __init__(self, events: list, refused: list, inputs: list):
        super().__init__()
        self.events, self.refused = events, refused
        self.inputs = {_storage(t) for t in inputs}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name.endswith("_") and args and isinstance(args[0], torch.Tensor) and \
                _storage(args[0]) in self.inputs:
            # never run on the caller's data: a dry pass's values are garbage
            self.refused.append(f"torch.ops.aten.{name} writes into an input")
            return args[0]
        out = func(*args, **kwargs)
        if name in COPIES:
            target = args[0] if COPIES[name] == 0 else out
            source = args[1] if COPIES[name] == 0 else args[0]
            if isinstance(source, torch.Tensor) and source.device == target.device:
                self.events.append(("copy", target, source))
            else:
                self.refused.append(f"torch.ops.aten.{name} across devices")
        elif name in FILLS or name in ZEROS or name in FULLS:
            target = args[0] if name in FILLS else out
            value = 0.0 if name in ("zero_", *ZEROS) else \
                (args[1] if name == "fill_" else args[FULLS[name]])
            if isinstance(value, torch.Tensor):
                self.refused.append(f"{name} with a tensor value")
            else:
                self.events.append(("fill", target, float(value)))
        elif name not in ALLOCATE and name not in VIEW and not name.startswith(METADATA_PREFIXES):
            self.refused.append(f"torch.ops.aten.{name}")
        return out


class _Recording:
    """What a dry pass of one call saw."""

    def __init__(self, args: tuple):
        self.args = args
        self.events: list = []   # ("launch", kernel, grid, args, kwargs) | ("fill", t, value)
        self.refused: list = []  # | ("copy", target, source), in the order they happened
        self.boundary = 0        # events[:boundary] are the forward's
        self.outs: tuple = ()
        self.single = True
        self.grads: list = []
        self.grads_out: tuple = ()

    def forward_returned(self, outs) -> None:
        self.single = not isinstance(outs, tuple)
        self.outs = (outs,) if self.single else tuple(outs)
        self.boundary = len(self.events)


@contextlib.contextmanager
def _dry(rec: _Recording):
    """The dry pass's setting: launches noted, not run (launch.py keeps their arguments),
    torch operations noted by _OpLog, no autograd. An exception of the pass is noted as the
    reason to refuse (the real call that follows raises it, with its own traceback)."""
    recorder = _launch._RECORDER
    recorder.jobs, recorder.keep = rec.events, True
    try:
        inputs = [a for a in rec.args if isinstance(a, torch.Tensor)]
        with torch.no_grad(), _OpLog(rec.events, rec.refused, inputs):
            yield
    except Exception as exc:  # noqa: BLE001 - see above
        rec.refused.append(f"the dry pass raised {type(exc).__name__}: {exc}")
    finally:
        recorder.jobs, recorder.keep = None, False


def _record_forward(fn, args: tuple) -> _Recording:
    """A dry pass of `fn(*args)`, a forward that computes no gradient (no backward)."""
    rec = _Recording(args)
    with _dry(rec):
        rec.forward_returned(fn(*args))
    return rec


def _record(function, args: tuple) -> _Recording:
    """A dry pass of an autograd.Function's forward, then of its backward on gradients
    shaped like its outputs."""
    rec = _Recording(args)
    ctx = _launch._DryContext(args)
    with _dry(rec):
        rec.forward_returned(function.forward(ctx, *args))
        rec.grads = [torch.empty_like(o) for o in rec.outs]
        grads_out = function.backward(ctx, *rec.grads)
        rec.grads_out = grads_out if isinstance(grads_out, tuple) else (grads_out,)
    return rec


# ---------------------------------------------------------------------------------------
# Planning: locate every tensor, encode every launch
# ---------------------------------------------------------------------------------------

def _extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to just past its last."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _layout_words(dtype, sizes, strides) -> list[int]:
    if dtype not in SCALAR_TYPES:
        raise Refused(f"a tensor of dtype {dtype}")
    return [SCALAR_TYPES[dtype], len(sizes), *sizes, *strides]


class _Bases:
    """One program's bases and where each tensor of the dry pass lies in them."""

    def __init__(self):
        self.words: list[list[int]] = []  # per base, its encoding
        self.by_storage: dict = {}        # storage address -> base index (temps, gradients)
        self.inputs: list = []            # (base index, tensor) of inputs or saved bases

    def add(self, kind: int, index: int, nbytes: int = 0, typed=None) -> int:
        layout = ([0, -1] if typed is None
                  else _layout_words(typed.dtype, typed.shape, typed.stride()))
        self.words.append([kind, index, nbytes, *layout])
        return len(self.words) - 1


def _addressed(t) -> None:
    if not isinstance(t, torch.Tensor):
        raise Refused(f"a {type(t).__name__} where a kernel takes a pointer")
    if t.untyped_storage().nbytes() == 0:
        raise Refused("an empty buffer (no address to tell it apart from others)")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Planner:
    """Builds the forward and backward programs of a recording."""

    def __init__(self, rec: _Recording, compiled):
        self.rec, self.compiled = rec, compiled
        self.tensor_args = [a for a in rec.args if isinstance(a, torch.Tensor)]
        self.fwd, self.bwd = _Bases(), _Bases()
        self.fwd_storages: dict = {}  # storage address -> forward base (temps)
        self.saved: list[int] = []    # forward bases the backward reads, in order
        self.saved_index: dict = {}   # forward base -> its index in `saved`
        for i, t in enumerate(self.tensor_args):
            self.fwd.inputs.append((self.fwd.add(INPUT, i), t))
        out_storages = {_storage(o): o for o in rec.outs}
        self.out_storages = out_storages

    # -- locating ---------------------------------------------------------------------
    def _in_inputs(self, bases: _Bases, t: torch.Tensor):
        ptr, span, storage = t.data_ptr(), _extent(t), _storage(t)
        best = None
        for base, inp in bases.inputs:
            if _storage(inp) != storage:
                continue
            lo = inp.data_ptr()
            if lo <= ptr and ptr + span <= lo + max(_extent(inp), 1):
                if ptr == lo:
                    return base, 0
                best = best or (base, ptr - lo)
        if best is None and any(_storage(inp) == storage for _, inp in bases.inputs):
            raise Refused("a kernel argument reaches outside the input it views")
        return best

    def _fwd_base(self, t: torch.Tensor) -> tuple[int, int]:
        _addressed(t)
        found = self._in_inputs(self.fwd, t)
        if found is not None:
            return found
        storage = _storage(t)
        base = self.fwd_storages.get(storage)
        if base is None:
            whole = self.out_storages.get(storage)
            nbytes = t.untyped_storage().nbytes()
            typed = whole if whole is not None and whole.storage_offset() == 0 and \
                _extent(whole) == nbytes and whole.numel() > 0 else None
            base = self.fwd_storages[storage] = self.fwd.add(TEMP, 0, nbytes, typed)
        return base, t.data_ptr() - storage

    def _bwd_base(self, t: torch.Tensor) -> tuple[int, int]:
        _addressed(t)
        storage = _storage(t)
        base = self.bwd.by_storage.get(storage)
        if base is not None:
            return base, t.data_ptr() - storage
        for k, g in enumerate(self.rec.grads):
            if _storage(g) == storage:
                base = self.bwd.by_storage[storage] = self.bwd.add(GRAD, k)
                return base, t.data_ptr() - storage
        # something of the forward's (an input, or a buffer it allocated): saved for it
        fwd_found = self._in_inputs(self.fwd, t)
        if fwd_found is None and storage in self.fwd_storages:
            fwd_found = (self.fwd_storages[storage], t.data_ptr() - storage)
        if fwd_found is not None:
            fwd_base, offset = fwd_found
            if fwd_base not in self.saved_index:
                self.saved_index[fwd_base] = len(self.saved)
                self.saved.append(fwd_base)
                key = ("saved", fwd_base)
                self.bwd.by_storage[key] = self.bwd.add(SAVED, self.saved_index[fwd_base])
            return self.bwd.by_storage[("saved", fwd_base)], offset
        # a buffer of the backward's own (untyped bytes: the gradients it returns are views
        # of it, as the Python path's are)
        base = self.bwd.by_storage[storage] = self.bwd.add(TEMP, 0, t.untyped_storage().nbytes())
        return base, t.data_ptr() - storage

    # -- encoding ---------------------------------------------------------------------
    def _view(self, locate, t) -> list[int]:
        if t is None:
            return [-1]
        if not isinstance(t, torch.Tensor):
            raise Refused(f"a {type(t).__name__} where a tensor or None was returned")
        base, offset = locate(t)
        if offset % t.element_size():
            raise Refused("a view at a byte offset that is not a whole element")
        if t.dtype not in SCALAR_TYPES:
            raise Refused(f"a tensor of dtype {t.dtype}")
        return [base, SCALAR_TYPES[t.dtype], offset // t.element_size(), t.dim(), *t.shape,
                *t.stride()]

    def _launch(self, locate, kernel, grid, args, kwargs) -> list[int]:
        ck, names = self.compiled(kernel, grid, args, kwargs)
        md = ck.metadata
        for attr, ok in (("num_ctas", 1), ("launch_cooperative_grid", False),
                         ("launch_pdl", False), ("global_scratch_size", 0),
                         ("profile_scratch_size", 0)):
            if getattr(md, attr, ok) != ok:
                raise Refused(f"kernel {kernel.fn.__name__} needs {attr}={getattr(md, attr)}")
        if getattr(md, "tensordesc_meta", None):
            raise Refused(f"kernel {kernel.fn.__name__} takes tensor descriptors")
        values = dict(zip(names, args))
        values.update(kwargs)
        for p in getattr(kernel, "params", ()):
            if p.name not in values and p.has_default:
                values[p.name] = p.default
        src = ck.src
        arg_names = list(src.fn.arg_names)
        # Triton 3.3+ keys constants by name; earlier ones by (index,) tuples or indices
        constants = {arg_names.index(k) if isinstance(k, str)
                     else (k[0] if isinstance(k, tuple) else k)
                     for k in getattr(src, "constants", {})}
        signature = {(arg_names.index(k) if isinstance(k, str) else k): v
                     for k, v in src.signature.items()}
        params: list[int] = []
        count = 0
        for i in sorted(signature):
            ty = signature[i]
            if ty == "constexpr" or i in constants:
                continue
            name = arg_names[i]
            value = values[name]
            count += 1
            if not isinstance(ty, str):
                raise Refused(f"kernel {kernel.fn.__name__}: parameter {name} of type {ty}")
            if ty.startswith("*"):
                if value is None:
                    params.append(NULLPTR)
                else:
                    base, offset = locate(value)
                    params += [PTR, base, offset]
            elif ty in ("i32", "i1"):
                params += [I32, int(value)]
            elif ty == "i64":
                params += [I64, int(value)]
            elif ty in ("fp32", "f32"):
                params += [F32, struct.unpack("<i", struct.pack("<f", float(value)))[0]]
            elif ty == "fp64":
                params += [F64, struct.unpack("<q", struct.pack("<d", float(value)))[0]]
            else:
                raise Refused(f"kernel {kernel.fn.__name__}: parameter {name} of type {ty}")
        grid = tuple(grid) + (1,) * (3 - len(grid))
        return [LAUNCH, int(ck.function), *(int(g) for g in grid), 32 * md.num_warps,
                int(md.shared), count, *params]

    def _steps(self, events, locate) -> list[list[int]]:
        steps = []
        for event in events:
            if event[0] == "fill":
                _, t, value = event
                steps.append([FILL, *self._view(locate, t),
                              struct.unpack("<q", struct.pack("<d", value))[0]])
            elif event[0] == "copy":
                _, target, source = event
                steps.append([COPY, *self._view(locate, target), *self._view(locate, source)])
            else:
                _, kernel, grid, args, kwargs = event
                steps.append(self._launch(locate, _launch.jit_of(kernel), grid, args, kwargs))
        return steps

    def words(self) -> list[int]:
        rec = self.rec
        fwd_steps = self._steps(rec.events[:rec.boundary], self._fwd_base)
        fwd_outs = [self._view(self._fwd_base, o) for o in rec.outs]
        for o in rec.outs:
            if self._in_inputs(self.fwd, o) is not None:
                raise Refused("an output that is (a view of) an input")
        bwd_steps = self._steps(rec.events[rec.boundary:], self._bwd_base)
        # autograd.Function lets a backward return trailing Nones past its arguments
        if any(g is not None for g in rec.grads_out[len(rec.args):]):
            raise Refused("more gradients than arguments")
        grads_out = list(rec.grads_out[:len(rec.args)])
        grads_out += [None] * (len(rec.args) - len(grads_out))
        bwd_outs = []
        for a, g in zip(rec.args, grads_out):
            if isinstance(a, torch.Tensor):
                bwd_outs.append(self._view(self._bwd_base, g))
            elif g is not None:
                raise Refused("a gradient for an argument that is not a tensor")
        words = _program(self.fwd, fwd_steps, fwd_outs)
        words += [len(self.saved), *self.saved, len(rec.grads)]
        for g in rec.grads:
            words += _layout_words(g.dtype, g.shape, g.stride())
        words += _program(self.bwd, bwd_steps, bwd_outs)
        return words


def _program(bases: _Bases, steps, outputs) -> list[int]:
    words = [len(bases.words)]
    for b in bases.words:
        words += b
    words.append(len(steps))
    for s in steps:
        words += s
    words.append(len(outputs))
    for o in outputs:
        words += o
    return words


def _compiled_kernel(kernel, grid, args, kwargs):
    """(CompiledKernel, positional parameter names) of one recorded launch: compiled (or
    found compiled) by Triton for exactly these arguments, and loaded on this device."""
    _launch._wait_for(kernel)
    ck = kernel.warmup(*args, grid=grid, **kwargs)
    if getattr(ck, "function", None) is None:
        init = getattr(ck, "_init_handles", None)
        if init is not None:
            init()
    if getattr(ck, "function", None) is None:
        raise Refused(f"kernel {kernel.fn.__name__} has no loaded CUfunction")
    return ck, [p.name for p in kernel.params][:len(args)]


def plan_words(rec: _Recording, compiled=_compiled_kernel) -> list[int]:
    """The plan of a recording (replay.cpp's encoding), or Refused with the reason."""
    if rec.refused:
        raise Refused("; ".join(dict.fromkeys(rec.refused)))
    for a in rec.args:
        if isinstance(a, tuple) and any(isinstance(b, torch.Tensor) for b in a):
            raise Refused("a tuple holding tensors among the Function's arguments")
    tensors = [a for a in rec.args if isinstance(a, torch.Tensor)]
    if not tensors:
        raise Refused("no tensor argument")
    if any(t.numel() == 0 for t in tensors):
        raise Refused("an empty tensor (its buffers have no address to tell them apart)")
    return _Planner(rec, compiled).words()


def describe(function, args: tuple) -> str:
    """What a replay of `function.apply(*args)` would do, in words: each launch of the dry
    pass with its arguments located (an argument of the call, a buffer the plan allocates, a
    saved buffer, an output's gradient) and its scalars, as the plan fixes them. Works
    wherever the dry pass does (in Triton's CPU interpreter too: its tiles are smaller)."""
    rec = _record(function, args)
    if rec.refused:
        return "stays on the Python path: " + "; ".join(dict.fromkeys(rec.refused))
    planner = _Planner(rec, compiled=None)
    arg_names = [n for n, a in zip(list(inspect.signature(function.forward).parameters)[1:], args)
                 if isinstance(a, torch.Tensor)]

    def label(bases: _Bases, base: int) -> str:
        kind, index, nbytes = bases.words[base][:3]
        if kind == INPUT:
            return arg_names[index]
        if kind == GRAD:
            return f"grad_output{index}"
        if kind == SAVED:
            return "saved " + label(planner.fwd, planner.saved[index])
        return f"{'fwd' if bases is planner.fwd else 'bwd'}_buffer{base}[{nbytes} B]"

    lines = []
    for phase, events, locate, bases in (
            ("forward", rec.events[:rec.boundary], planner._fwd_base, planner.fwd),
            ("backward", rec.events[rec.boundary:], planner._bwd_base, planner.bwd)):
        lines.append(f"{phase}:")
        for event in events:
            if event[0] != "launch":
                target = locate(event[1])
                lines.append(f"  {event[0]} into {label(bases, target[0])}+{target[1]}")
                continue
            _, kernel, grid, a, kw = event
            fn = _launch.jit_of(kernel).fn
            parts = []
            for name, value in zip(inspect.signature(fn).parameters, a):
                if isinstance(value, torch.Tensor):
                    base, offset = locate(value)
                    parts.append(f"{name}={label(bases, base)}" + (f"+{offset}" if offset else ""))
                elif value is not None:
                    parts.append(f"{name}={value}")
            parts += [f"{k}={v}" for k, v in kw.items()]
            lines.append(f"  {fn.__name__}[grid={tuple(grid)}]({', '.join(parts)})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------------------

_TABLE: dict = {}    # (Function, signature) -> _Served | why it stays on Python (str)
_REASONS: dict = {}  # "module.Function" -> why its last refused signature was refused
_OPS: list = []      # torch.ops.levels_triton, once loaded
_MAX_PLANS = 4096    # a process that sees ever new shapes starts the table over (the C++
# plans themselves stay, a few KB each: an autograd node of an earlier call may still run
# its backward from one)


class _Served(tuple):
    """A replayable signature's entry: (plan id, pick, single). pick(args) is the call's
    tensors in order, by position: a signature fixes where the tensors are (a tensor and a
    None key differently), so the positions found at the recording hold for every call that
    hits it. Picking by position (operator.itemgetter) costs ~0.1 us; testing each argument
    with isinstance cost 1.5 us for attention's twelve on the CI machine, on every call."""
    __slots__ = ()

    @staticmethod
    def of(plan: int, args: tuple, single: bool) -> "_Served":
        at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        pick = operator.itemgetter(*at) if len(at) > 1 else (lambda a, i=at[0]: (a[i],))
        return _Served((plan, pick, single))


def reasons() -> dict:
    """"module.function" (a Function, or a launcher's inference forward) -> why its last
    refused signature runs on the Python path."""
    return dict(_REASONS)


def call(function, args: tuple):
    """`function.apply(*args)`: replayed when this signature has a plan; the first call of a
    signature runs the Python path (launch.apply_python) after a dry pass recorded it, and
    leaves its plan (or the reason there is none). None: the caller runs the Python path."""
    return _serve(function, args, False)


def call_forward(fn, args: tuple):
    """`fn(*args)`, a forward that computes no gradient, replayed without an autograd node
    once its signature has a plan (recorded at its first call, as `call` does); None: the
    caller runs `fn` itself."""
    return _serve(fn, args, True)


def _serve(fn, args: tuple, forward_only: bool):
    key = _signature(args)
    if key is None:
        return None
    key = (fn, key)
    entry = _TABLE.get(key)
    if entry.__class__ is _Served:
        if _hooked():
            return None
        plan, pick, single = entry
        ops = _OPS[0]
        op = ops.replay_forward.default if forward_only else ops.replay.default
        outs = op(plan, pick(args))
        return outs[0] if single else tuple(outs)
    if entry is not None or not _recordable(args):
        return None  # refused (the reason is in _TABLE), or not to be recorded now
    if forward_only:
        rec = _record_forward(fn, args)
        out = fn(*args)  # the real first call: it compiles
    else:
        rec = _record(fn, args)
        out = _launch.apply_python(fn, args)
    plan = _finish(fn, rec)
    _remember(key, _Served.of(plan, args, rec.single) if plan.__class__ is int else plan)
    return out


def _recordable(args: tuple) -> bool:
    """Whether a new signature may be recorded now (see the module docstring): CUDA tensors
    only (a CPU tensor here is a test standing in for the GPU; it never needs the library)."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None or not first.is_cuda:
        return False
    if first.device.index != torch.cuda.current_device():
        # Triton compiles and loads for the current device, and a plan's CUfunctions are
        # that device's: a call on another one stays on the Python path, as it launches
        return False
    if torch.compiler.is_compiling() or _launch.autotuning() or _hooked():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _remember(key, entry) -> None:
    if len(_TABLE) >= _MAX_PLANS:
        _TABLE.clear()
    _TABLE[key] = entry


def _name(function) -> str:
    return f"{function.__module__.rsplit('.', 1)[-1]}.{function.__qualname__}"


def _finish(function, rec: _Recording):
    """The plan id of a recording, or why there is none (also kept in _REASONS)."""
    ops = load()
    if ops is None:
        return unavailable() or "the C++ library did not load"
    try:
        words = plan_words(rec)
    except Refused as exc:
        _REASONS[_name(function)] = str(exc)
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a planner bug must not fail the user's call
        reason = f"the plan could not be built ({type(exc).__name__}: {exc})"
        _REASONS[_name(function)] = reason
        warnings.warn(f"levels: {_name(function)} stays on Level 4's Python path: {reason}",
                      RuntimeWarning, stacklevel=4)
        return reason
    try:
        plan = ops.add_plan(words, False)
    except RuntimeError as exc:  # the kernel's parameters are not the plan's (replay.cpp)
        reason = str(exc).splitlines()[0]
        _REASONS[_name(function)] = reason
        return reason
    if not _OPS:
        _OPS.append(ops)
    return plan


def _hooked() -> bool:
    runtime = _launch.knobs.runtime
    return (_launch._hook(runtime.launch_enter_hook) is not None
            or _launch._hook(runtime.launch_exit_hook) is not None)


def stats() -> dict:
    """How many signatures of this process replay, and how many stay on the Python path."""
    values = list(_TABLE.values())
    return {"replayed": sum(v.__class__ is _Served for v in values),
            "python": sum(v.__class__ is str for v in values)}
