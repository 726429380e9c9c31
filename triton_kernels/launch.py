"""Launching a Triton kernel with less Python: where a small call's microseconds go.

(Since the C++ replay, replay.py, this path serves a signature's first call and whatever
cannot be replayed; every later call of a replayable signature skips Python altogether.)

`kernel[grid](*args)` is convenient, and at a small problem the host's part of a call is
most of its time. Each launch, Triton's JIT binds every argument to the signature, asks
its specializer about each one (a pointer's 16-byte alignment, whether an integer is 1 or
a multiple of 16), turns that and the options into a key, looks the compiled kernel up,
and only then calls the CUDA launcher. Measured on an H100's host (`scripts/probe_host.py`,
one layer_norm launch, tiny problem): 26-32 us through `kernel[grid]`, 10-11.5 us for the
compiled kernel's launcher alone, against 19-28 us for a whole eager `F.layer_norm`.

A kernel decorated `@fast_launch` (above `@triton.jit`) is still launched the Triton way,
`kernel[grid](*args, **constexprs)`, in every file of triton_kernels/: that call goes to
`launch(kernel, grid, *args, **constexprs_and_options)`, which keeps the launcher and skips
the rest when it can:

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

What it saved was smaller than the launcher alone suggests with the first key (layer_norm's
launch: 26 -> 24 us on that host, reports/h100-host-probe.json, the key built by one Python
call per argument, the kernel hashed by its cache_key property per launch, the constexprs
re-collected per launch): building a key in Python costs much of what the JIT's C++
specializer costs. The key now is one comprehension over the positional arguments plus the
keyword arguments as they come, the kernel's table is found by id, and the constexprs and
defaults to append are stored with the compiled kernel (the profile of
reports/h100-host-path-probe-before.json showed the old per-launch work). The larger savings
came from around the launches: no autograd.Function.apply when nothing needs a gradient
(`needs_grad`), fewer allocations (no statistics stored without a backward), the contract's
validation once per argument signature (levels/triton.py), and no import per call.

`cdiv` and `next_power_of_2` are here because Triton's own are ConstexprFunction objects
on recent versions: usable inside kernels, but several microseconds per host call.

Compiling ahead (`compile_ahead`): the first call at a new shape is mostly compilation,
one kernel after another as the call reaches them: a forward+backward of the MLP compiles
up to six GEMM specializations and its column sums, of conv_bn in training about ten
kernels. Each is a few hundred milliseconds to seconds of Triton's compiler, much of it in
C++ passes and in `ptxas` (a child process), which other threads can overlap. So when a
call of one of Level 4's autograd.Functions reaches its first launch at a new shape, the
launcher first runs that Function's forward and backward *dry*: every `launch` is recorded,
not run (the Python between launches runs, on uninitialized buffers nobody reads), and
each distinct specialization it recorded is compiled in a pool of threads with Triton's
`kernel.warmup`, which also loads each binary. The real call then goes on; a launch whose
kernel is still compiling waits for it (the forward's own kernels first, the backward's
finish while the forward runs). Measured on the H100 (scripts/probe_first_calls.py,
reports/h100-first-calls.json, cold cache, a new process): first forward+backward 1.4-2.8x
faster, GNMT's LSTM 12.8 -> 6.1 s, ResNet-50's stem 9.2 -> 3.3 s, the MLP at its bench
shape 11.3 -> 4.7 s. The signal is free: the first launch of a call at a new shape misses the direct
path's table (`launch` above), and `apply_ahead` has left the call's Function and
arguments where that launch finds them. What it costs: one dry pass of host time per new
shape (about the call's own host time, paid even when every kernel was compiled already
at another shape that specializes the same way), a few stand-in tensors, threads. Only
calls that will run a backward compile ahead (their first call compiles the most
kernels); inference calls compile as they launch, and so does everything when the direct
path is off. `LEVELS_TRITON_COMPILE_AHEAD=0` switches it off, to measure the difference.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

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

# Under torch.compile, Dynamo captures our kernels as user-defined Triton kernels and
# Inductor launches them from its generated code. By default it launches them through
# Triton's own launcher (the Python path this module avoids in eager mode: binding,
# launch metadata, hooks), while its own kernels go through a static C++ launcher. A GPT-2
# small training step compiled whole made ~240 launches of ours per step, and that path
# made the step host-bound: 23.5 ms of host time for 19.1 ms of GPU time (H100,
# scripts/probe_model_host.py --compile). With Inductor told to launch user-defined kernels
# statically too, the same step issued in 14.3 ms and trained at 1.46x the native level
# compiled, against 0.85x before (reports/compiled-static-launch/). Inductor reads the
# switch from this environment variable when its config module is first imported (which
# torch.compile does, after this import in any program that uses Level 4), and an
# unsupported kernel still falls back to Triton's launcher inside Inductor. What it costs:
# the switch is process-wide, so it applies to a program's other user-defined kernels
# too, and as an environment variable it takes precedence over a value set in code. Set
# the variable to 0 before importing levels to keep Inductor's default.
STATIC_LAUNCH_ENV = "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"


def _inductor_launches_ours_statically() -> None:
    if INTERPRETED or STATIC_LAUNCH_ENV in os.environ:
        return  # the CPU interpreter compiles nothing; a value already set is the user's
    os.environ[STATIC_LAUNCH_ENV] = "1"
    config = sys.modules.get("torch._inductor.config")
    if config is not None and hasattr(config, "static_launch_user_defined_triton_kernels"):
        # imported before us: it has read the environment already
        config.static_launch_user_defined_triton_kernels = True


_inductor_launches_ours_statically()

# replay.py, once installed (replay.install, called by levels.triton): later calls of a
# recorded signature replay from C++. None: every call takes the Python path.
_replay = None


class _Plan:
    """Per kernel: the parameter order and defaults, and by our key the compiled kernel with
    the trailing arguments it takes after the positional ones (constexprs and defaults, in
    signature order: fixed by the key, so built once)."""

    def __init__(self, kernel):
        self.kernel = kernel  # held: the table is keyed by id(kernel), which must stay its own
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
    of 1 to 3 ints; constexprs and options are keyword arguments, as with `kernel[grid]`.
    While compile_ahead records a dry pass in this thread, the launch is recorded instead
    and nothing runs (returns None)."""
    jobs = _RECORDER.jobs
    if jobs is not None:
        # replay.py keeps the launch as it is (it locates every tensor); compile_ahead
        # keeps stand-ins (it needs only what Triton specializes on)
        jobs.append(("launch", kernel, grid, args, kwargs) if _RECORDER.keep
                    else _job(kernel, args, kwargs))
        return None
    if _BROKEN or not ENABLED or INTERPRETED or torch.compiler.is_compiling():
        if _PENDING:
            _wait_for(kernel)
        return kernel[grid](*args, **kwargs)
    # by id: hashing a JITFunction reads its cache_key property, microseconds a launch
    plan = _PLANS.get(id(kernel))
    if plan is None:
        plan = _PLANS[id(kernel)] = _Plan(kernel)
    if not _DRIVER:
        _DRIVER.append((driver.active.get_current_device, driver.active.get_current_stream))
    current_device, current_stream = _DRIVER[0]
    device = current_device()
    # The key: each tensor by dtype and 16-byte alignment, everything else by class and
    # value (class: 1, True and 1.0 are equal keys in Python), then the keyword arguments
    # (constexprs and options) by name and value.
    key = (device, tuple([(a.dtype, a.data_ptr() & 15) if isinstance(a, torch.Tensor)
                          else (a.__class__, a) for a in args]), tuple(kwargs.items()))
    entry = plan.compiled.get(key)
    if entry is None:
        return _first_launch(kernel, plan, key, grid, args, kwargs)
    ck, rest = entry
    stream = current_stream(device)
    runtime = knobs.runtime
    # Profilers (Triton's proton) hook launches through knobs: keep honouring them.
    enter, leave = _hook(runtime.launch_enter_hook), _hook(runtime.launch_exit_hook)
    metadata = None if enter is None else ck.launch_metadata(grid, stream, *args, *rest)
    n = len(grid)
    ck.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, ck.function,
           ck.packed_metadata, metadata, enter, leave, *args, *rest)
    return ck


def _first_launch(kernel, plan: _Plan, key, grid, args, kwargs):
    """A key the table has not seen: compile ahead if a call is starting, launch through
    the JIT (which compiles if needed), keep what it returns."""
    call = _RECORDER.call
    if call is not None:  # the first launch of a call at a new shape: compile ahead
        _RECORDER.call = None
        compile_ahead(*call)
    if _PENDING:  # compile_ahead may be compiling this very specialization
        _wait_for(kernel)
    ck = kernel[grid](*args, **kwargs)
    why = _usable(ck)
    if why is not None:
        _BROKEN.append(why)
        warnings.warn(f"levels: Level 4 launches kernels through kernel[grid] in this process "
                      f"({why}; triton {triton.__version__}): slower per call, same results",
                      RuntimeWarning, stacklevel=3)
        return ck
    if len(plan.compiled) >= _MAX_KEYS:
        plan.compiled.clear()
    rest = tuple(kwargs[name] if name in kwargs else plan.defaults[name]
                 for name in plan.names[len(args):])
    plan.compiled[key] = (ck, rest)
    return ck


class Launcher:
    """`kernel[grid](*args, **constexprs)`, Triton's own idiom, for a kernel decorated with
    `@fast_launch`: the call goes through `launch`. Every other attribute is the
    JITFunction's (`fn`, `params`, `warmup`, `device_caches`), so the kernel still reads,
    compiles and is inspected as a Triton kernel."""

    def __init__(self, jit):
        self.jit = jit

    def __getitem__(self, grid):
        if torch.compiler.is_compiling():
            # Dynamo captures a user kernel from the JITFunction's own kernel[grid]
            return self.jit[grid]
        return functools.partial(launch, self.jit, grid)

    def __getattr__(self, name):
        return getattr(self.jit, name)

    def __repr__(self) -> str:
        return f"fast_launch({self.jit!r})"


def fast_launch(kernel) -> Launcher:
    """Decorator (above `@triton.jit`): `kernel[grid](...)` then launches directly once a
    specialization has been compiled (the module docstring says what that saves)."""
    return Launcher(kernel)


def jit_of(kernel):
    """The JITFunction behind a kernel, decorated with `fast_launch` or not."""
    return kernel.jit if isinstance(kernel, Launcher) else kernel


def _hook(hook):
    """None for no hook: Triton >= 3.7 keeps an empty HookChain there, whose launch metadata
    (a dict built per launch) nobody would read."""
    if hook is not None and not getattr(hook, "calls", True):
        return None
    return hook


def compiled_count(kernel) -> int:
    """How many specializations of `kernel` the direct path holds (tests, explain)."""
    plan = _PLANS.get(id(jit_of(kernel)))
    return 0 if plan is None else len(plan.compiled)


# ---------------------------------------------------------------------------------------
# Compiling ahead: a new signature's kernels, all at once (see the module docstring).
# ---------------------------------------------------------------------------------------

COMPILE_AHEAD = os.environ.get("LEVELS_TRITON_COMPILE_AHEAD", "1") != "0"
# Threads that compile: each compile also runs ptxas in a child process. More threads than
# a first call has kernels (2-9) would idle.
COMPILE_THREADS = max(1, min(8, os.cpu_count() or 1))


class _Recorder(threading.local):
    jobs: list | None = None  # this thread's recorded launches, during a dry pass
    keep: bool = False  # record the launches' own arguments (replay.py), not stand-ins
    call: tuple | None = None  # (Function, args) of the apply_ahead call under way


_RECORDER = _Recorder()


_LOCK = threading.Lock()
_PENDING: dict = {}  # kernel -> futures of its compiles in flight
_POOL: list = []
_STAND_INS: dict = {}


def recording() -> bool:
    """Whether this thread is in compile_ahead's dry pass (launches are recorded, not run)."""
    return _RECORDER.jobs is not None


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A tiny tensor Triton specializes exactly as it would `t` (dtype, device, and whether
    its address is a multiple of 16), so a compile in flight keeps no large buffer alive."""
    aligned = t.data_ptr() % 16 == 0
    key = (t.device, t.dtype, aligned)
    s = _STAND_INS.get(key)
    if s is None:
        base = torch.empty(64, device=t.device, dtype=t.dtype)
        s = _STAND_INS[key] = base if aligned else base[1:]  # 1 element past: misaligned
    return s


def _job(kernel, args, kwargs):
    args = tuple(_stand_in(a) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: _stand_in(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return kernel, args, kwargs


def _specialization(kernel, args, kwargs) -> tuple:
    """What Triton specializes a launch on, as far as it matters here: constexprs by value,
    a tensor by dtype and 16-byte alignment, an int by being 1, a multiple of 16, or
    beyond 32 bits, a float by nothing. Launches that agree on it compile once, so the
    T launches of a step-by-step recurrence are one job, not T. (An approximation that
    merges two Triton would tell apart only costs that one a compile at its launch.)"""
    params = getattr(kernel, "params", ())
    out = []
    for i, a in enumerate(args):
        if i < len(params) and params[i].is_constexpr:
            out.append(a)
        elif isinstance(a, torch.Tensor):
            out.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or a is None:
            out.append(a)
        elif isinstance(a, int):
            out.append((int, a == 1, a % 16 == 0, -2 ** 31 <= a < 2 ** 31))
        elif isinstance(a, float):
            out.append(float)
        else:
            out.append(a)
    return tuple(out), tuple(sorted(kwargs.items(), key=lambda kv: kv[0]))


class _DryContext:
    """Stands in for autograd's ctx in a dry pass: what our Functions use of it."""

    def __init__(self, args):
        self.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.requires_grad
                                      for a in args)
        self.saved_tensors = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def apply_ahead(function, *args):
    """`function.apply(*args)` for an autograd.Function of Level 4: replayed from C++ once
    its argument signature has been recorded (replay.py), else run in Python, compiling
    ahead: if a launch of this call finds a key its table has not seen (a new shape, almost
    always), `compile_ahead` runs first. What that costs per call: two thread-local writes."""
    replay = _replay
    if replay is not None and replay.ENABLED and not INTERPRETED and ENABLED and not _BROKEN:
        out = replay.call(function, args)
        if out is not None:
            return out
    return apply_python(function, args)


def forward_ahead(fn, *args):
    """`fn(*args)`, a launcher's forward for a call that computes no gradient (inference,
    no_grad): replayed from C++ once its signature has been recorded, as apply_ahead's
    calls are (replay.py), without an autograd node."""
    replay = _replay
    if replay is not None and replay.ENABLED and not INTERPRETED and ENABLED and not _BROKEN:
        out = replay.call_forward(fn, args)
        if out is not None:
            return out
    return fn(*args)


def apply_python(function, args: tuple):
    """`function.apply(*args)` the Python way, compiling ahead (see apply_ahead)."""
    rec = _RECORDER
    outer, rec.call = rec.call, (function, args)
    try:
        return function.apply(*args)
    finally:
        rec.call = outer


def compile_ahead(function, args) -> None:
    """Compile every kernel that `function`'s forward and backward launch for `args`, in
    COMPILE_THREADS threads, and return while they compile (see the module docstring)."""
    if not COMPILE_AHEAD or _BROKEN or not ENABLED or INTERPRETED or autotuning():
        return
    if torch.compiler.is_compiling():
        return  # Dynamo traces the launches
    gpu = torch.cuda.is_available()
    if gpu and torch.cuda.is_current_stream_capturing():
        return  # a capture would record the dry pass's own ops
    jobs = _record(function, args)
    distinct: dict = {}
    for kernel, a, kw in jobs:
        distinct.setdefault((kernel, _specialization(kernel, a, kw)), (kernel, a, kw))
    if not distinct:
        return
    device = torch.cuda.current_device() if gpu else None
    for kernel in {k for k, _, _ in distinct.values()}:
        caches = getattr(kernel, "device_caches", None)
        if caches is not None:
            caches[device]  # created here, once: two threads creating it could lose a compile
    pool = _pool()
    with _LOCK:
        for kernel, a, kw in distinct.values():
            _PENDING.setdefault(kernel, []).append(pool.submit(_warm, device, kernel, a, kw))


def autotuning() -> bool:
    """LEVELS_TRITON_AUTOTUNE=1: benchmark candidate tiles once per shape bucket and keep
    the winner on disk (tuning.py) instead of the size rules; read at each call (gemm.py
    and conv_bn.py's tiles; autotuned launches take no dry pass)."""
    return os.environ.get("LEVELS_TRITON_AUTOTUNE", "0") == "1"


def _record(function, args) -> list:
    ctx = _DryContext(args)
    _RECORDER.jobs = jobs = []
    try:
        with torch.no_grad():
            outs = function.forward(ctx, *args)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = [torch.empty_like(o) if isinstance(o, torch.Tensor) else None for o in outs]
            function.backward(ctx, *grads)
    except Exception:  # noqa: BLE001 - the real call raises it, with its own traceback
        pass  # (out of memory, say: the dry pass holds its buffers beside the caller's);
        # what it recorded before still compiles ahead
    finally:
        _RECORDER.jobs = None
    return jobs


def _pool() -> ThreadPoolExecutor:
    with _LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="levels-compile"))
        return _POOL[0]


def _warm(device: int | None, kernel, args, kwargs) -> None:
    if device is None:
        kernel.warmup(*args, grid=(1,), **kwargs)
        return
    with torch.cuda.device(device):  # Triton compiles for the thread's current device
        compiled = kernel.warmup(*args, grid=(1,), **kwargs)
        # Loading the binary into the GPU's context and building its launcher are left by
        # warmup to the first launch, in the caller's thread: done here, they overlap too.
        # (A kernel too large for the GPU raises here, and again at its launch.)
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()


def _wait_for(kernel) -> None:
    """Wait for kernel's compiles in flight. A failed one is not raised here: the launch
    that follows compiles it again in the caller's thread and raises there."""
    with _LOCK:
        futures = _PENDING.pop(kernel, None)
    for f in futures or ():
        f.exception()


def wait_compiles() -> None:
    """Wait for every compile in flight (tests, and timing that must not overlap them)."""
    while True:
        with _LOCK:
            if not _PENDING:
                return
            kernel = next(iter(_PENDING))
        _wait_for(kernel)
