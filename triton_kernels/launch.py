"""Launching a Triton kernel with less Python: where a small call's microseconds go.

`kernel[grid](*args)` is convenient, and at a small problem the host's part of a call is
most of its time. Each launch, Triton's JIT binds every argument to the signature, asks
its specializer about each one (a pointer's 16-byte alignment, whether an integer is 1 or
a multiple of 16), turns that and the options into a key, looks the compiled kernel up,
and only then calls the CUDA launcher. Measured on an H100's host (`scripts/probe_host.py`,
one layer_norm launch, tiny problem): 26-32 us through `kernel[grid]`, 10-11.5 us for the
compiled kernel's launcher alone, against 19-28 us for a whole eager `F.layer_norm`.

`launch(kernel, grid, *args, **constexprs_and_options)` keeps the launcher and skips the
rest when it can:

- the first call with a new key goes through `kernel[grid]` (which compiles if needed)
  and keeps the CompiledKernel it returns;
- later calls with that key call its launcher directly. The key is finer than Triton's
  own: each tensor by dtype and address modulo 16, every other argument (sizes,
  strides, constexprs, eps) by value, and the options (num_warps, num_stages). Equal keys
  therefore mean the same specialization, and a call Triton would compile differently (a
  misaligned view, an odd stride) has a new key and goes through the JIT first. A new
  shape costs one JIT pass; the table is bounded (it starts over past 1024 keys). Not
  followed: a kernel's global variables changing after compilation (the JIT raises;
  ours have none).

What it costs: it relies on Triton's `CompiledKernel.run` calling convention (the same
from Triton 3.6 to 3.9). A CompiledKernel that does not look the way it expects turns the
path off for the process, with one warning (same kernels, same results, slower).
`LEVELS_TRITON_FAST_LAUNCH=0` in the environment switches it off, to measure the
difference (the grader does, to count launches in JITFunction.run). While torch.compile
traces a model (Dynamo must see `kernel[grid]` to capture a user-defined Triton kernel)
and in the CPU interpreter, the JIT path is always taken.

What it saved is smaller than the launcher alone suggests (layer_norm's launch: 26 -> 24
us on that host, reports/h100-host-probe.json, with a first version of the key built by
one Python call per argument): building a key in Python costs much of what the JIT's C++
specializer costs. The larger savings in Level 4's host time came from around the launches: no
autograd.Function.apply when nothing needs a gradient (`needs_grad`), fewer allocations
and reshapes, no `triton.cdiv` on the host, and operand checks done once, by the contract.

`cdiv` and `next_power_of_2` are here because Triton's own are ConstexprFunction objects
on recent versions: usable inside kernels, but several microseconds per host call.
"""

from __future__ import annotations

import os
import warnings

import torch
import triton
from triton import knobs
from triton.runtime import driver

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 0 if n <= 0 else 1 << (n - 1).bit_length()  # as triton.next_power_of_2


def needs_grad(*tensors) -> bool:
    """Whether autograd will want a backward of this call. When it will not (inference,
    no_grad, weights without requires_grad) a launcher runs its forward directly:
    autograd.Function.apply cost ~12 us of host time per layer_norm call on an H100's host
    (reports/h100-host-probe.json: 54 us through apply, 43 us without)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# Read once, at import: the grader sets it in its child process's environment.
ENABLED = os.environ.get("LEVELS_TRITON_FAST_LAUNCH", "1") != "0"


class _Plan:
    """Per kernel: the parameter order and defaults, and the compiled kernels by our key."""

    def __init__(self, kernel):
        params = kernel.params
        self.names = [p.name for p in params]
        self.defaults = {p.name: p.default for p in params if p.has_default}
        self.compiled: dict = {}


_PLANS: dict = {}
_BROKEN: list[str] = []  # why the direct path is off in this process (once set, for good)
_MAX_KEYS = 1024  # per kernel; a process that sees more shapes starts the table over
_DRIVER: list = []  # (get_current_device, get_current_stream), bound once


def _usable(ck) -> str | None:
    for name in ("run", "function", "packed_metadata", "launch_metadata"):
        if not hasattr(ck, name):
            return f"Triton's CompiledKernel has no '{name}' here"
    return None


def launch(kernel, grid, *args, **kwargs):
    """`kernel[grid](*args, **kwargs)`, with the compiled kernel's launcher called directly
    once this specialization has been seen (see the module docstring). `grid` is a tuple
    of 1 to 3 ints; constexprs and options are keyword arguments, as with `kernel[grid]`."""
    if _BROKEN or not ENABLED or INTERPRETED or torch.compiler.is_compiling():
        return kernel[grid](*args, **kwargs)
    plan = _PLANS.get(kernel)
    if plan is None:
        plan = _PLANS[kernel] = _Plan(kernel)
    full = list(args)
    for name in plan.names[len(args):]:
        full.append(kwargs[name] if name in kwargs else plan.defaults[name])
    if not _DRIVER:
        _DRIVER.append((driver.active.get_current_device, driver.active.get_current_stream))
    current_device, current_stream = _DRIVER[0]
    device = current_device()
    # The key: each tensor by dtype and 16-byte alignment, everything else by class and
    # value (class: 1, True and 1.0 are equal keys in Python), then the options.
    key = (device, tuple([(a.dtype, a.data_ptr() & 15) if isinstance(a, torch.Tensor)
                          else (a.__class__, a) for a in full]),
           kwargs.get("num_warps"), kwargs.get("num_stages"), kwargs.get("num_ctas"),
           kwargs.get("maxnreg"))
    ck = plan.compiled.get(key)
    if ck is None:
        ck = kernel[grid](*args, **kwargs)
        why = _usable(ck)
        if why is not None:
            _BROKEN.append(why)
            warnings.warn(f"levels: Level 4 launches kernels through kernel[grid] in this process "
                          f"({why}; triton {triton.__version__}): slower per call, same results",
                          RuntimeWarning, stacklevel=2)
            return ck
        if len(plan.compiled) >= _MAX_KEYS:
            plan.compiled.clear()
        plan.compiled[key] = ck
        return ck
    stream = current_stream(device)
    runtime = knobs.runtime
    # Profilers (Triton's proton) hook launches through knobs: keep honouring them.
    enter, leave = _hook(runtime.launch_enter_hook), _hook(runtime.launch_exit_hook)
    metadata = None if enter is None else ck.launch_metadata(grid, stream, *full)
    n = len(grid)
    ck.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, ck.function,
           ck.packed_metadata, metadata, enter, leave, *full)
    return ck


def _hook(hook):
    """None for no hook: Triton >= 3.7 keeps an empty HookChain there, whose launch metadata
    (a dict built per launch) nobody would read."""
    if hook is not None and not getattr(hook, "calls", True):
        return None
    return hook


def compiled_count(kernel) -> int:
    """How many specializations of `kernel` the direct path holds (tests, explain)."""
    plan = _PLANS.get(kernel)
    return 0 if plan is None else len(plan.compiled)
