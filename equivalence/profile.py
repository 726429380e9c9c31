"""Profiling one level on one component: cold start, steady state, memory, throughput.

Two passes are timed, both with inputs that require grad (what training does):
  fwd      the forward call
  fwd+bwd  forward, then backward driven by a fixed random upstream gradient
The very first fwd+bwd call is timed on its own (`first_call_ms`): for torch.compile it
holds the compilation of both graphs, for Triton the JIT, for CUDA C++ the build.

A first call is only as slow as the caches let it be: Inductor and Triton keep what they
compiled on disk, and a second run of the same program skips most of the work. So each
first call records whether it found a warm cache (`first_call_cache`): "cold" when the
level's cache directory gained files during the call (it had to compile), "warm" when it
gained none, "unknown" when the level cannot tell; None for levels without a disk cache.
Another process writing to the same cache at the same moment can make a warm call look
cold; the directory and the file count are kept in `first_call_cache_detail`.

Optional extras (`levels profile` asks for them): the host time per call (the `tiny` size
timed end to end: what a call costs the CPU, whatever the device), the fraction of this
device's measured ceilings (`equivalence.ceilings`) and a torch.profiler Chrome trace.

Your own code is timed the same way: a registered level by its name, one function with
`profile(component, fn=my_function)` (its `level` is then "fn:<name>"; it runs behind the
contract's validator, as a level's functions validate first). Profiling does not check:
`check` does.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import cards
from .environment import triton_cache_dir
from .check import _open, _prepare, _target, dtype_name, flatten, fresh_seed, resolve_dtype
from .timing import peak_memory_mb, time_first_call, time_fn, time_host

NEVER = "never"  # break-even of a level that is not faster in steady state
SAME = "≈"  # break-even of a level whose steady state the timing cannot tell from the baseline's


@dataclass
class Profile:
    component: str
    level: str
    variant: str
    dtype: str
    device: str
    size: str
    shapes: dict
    status: str  # "ok", "skip", "untimed" (runs, but its time means nothing) or "error"
    reason: str = ""
    first_call_ms: float | None = None
    first_call_cache: str | None = None  # "cold", "warm", "unknown"; None: no disk cache
    first_call_cache_detail: str = ""
    fwd: dict | None = None
    fwd_bwd: dict | None = None
    host: dict | None = None  # fwd+bwd of the `tiny` size, calls back to back (time_host)
    peak_memory_mb: float | None = None
    flops: dict = field(default_factory=dict)
    min_bytes: dict = field(default_factory=dict)
    ceilings: dict | None = None  # equivalence.ceilings.Ceilings.to_dict() of this device
    trace: str | None = None  # path of the Chrome trace, if one was asked for
    notes: str = ""
    # where the wall time went: draw, open, inputs, first_call, fwd, fwd_bwd, memory (host, trace)
    wall_s: dict = field(default_factory=dict)

    def throughput(self, which: str = "fwd") -> dict:
        """Achieved TFLOP/s and TB/s of a pass (from the card's FLOPs and minimum bytes), and
        with ceilings, their fractions of this device's matmul rate and copy bandwidth."""
        timing = self.fwd if which == "fwd" else self.fwd_bwd
        if not timing:
            return {}
        seconds = timing["median_ms"] * 1e-3
        fl = self.flops["fwd"] + (self.flops["bwd"] if which != "fwd" else 0)
        by = self.min_bytes["fwd"] + (self.min_bytes["bwd"] if which != "fwd" else 0)
        rates = {"tflops": fl / seconds / 1e12, "tbps": by / seconds / 1e12}
        if self.ceilings:
            rates["of_matmul"] = rates["tflops"] / self.ceilings["matmul_tflops"]
            rates["of_copy"] = rates["tbps"] / self.ceilings["copy_tbps"]
        return rates

    def to_dict(self) -> dict:
        d = asdict(self)
        d["throughput"] = {"fwd": self.throughput("fwd"), "fwd_bwd": self.throughput("fwd+bwd")}
        return d


class _Laps:
    """lap(name) records the seconds since the previous lap (or since creation) in `into`."""

    def __init__(self, into: dict, start: float | None = None):
        self.into, self.last = into, time.perf_counter() if start is None else start

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = round(now - self.last, 3)
        self.last = now


def _case(card: cards.Card, size, variant: str, dtype, device, seed: int,
          cache: dict | None) -> cards.Case:
    """The case's random inputs, or the ones in `cache` when everything that decides their
    values matches. `compare` profiles every level of a component at one seed: the same
    numbers, drawn on the CPU and copied over, took 1-2 s per row at the bench size on the
    H100's host (about 20 s of a cold compare, reports/h100-compare-checks-in-threads.json). The
    levels never see these tensors: _prepare hands each call its own copies, so reusing
    them cannot leak one level's writes into the next. The cache keeps one case (a
    bench-size case is hundreds of MB), and lives as long as the caller keeps it."""
    if cache is None:
        return card.case(size, variant, dtype, device, seed)
    shape = tuple(sorted(size.items())) if isinstance(size, dict) else size
    key = (card.name, shape, variant, dtype, str(device), seed)
    if key not in cache:
        cache.clear()  # drop the old case before drawing the new one (peak memory)
        cache[key] = card.case(size, variant, dtype, device, seed)
    return cache[key]


def _passes(fn, case: cards.Case, seed: int):
    """Closures for one forward, and one forward+backward, on fixed inputs."""
    args, _ = _prepare(case, reference=False)
    inputs = [args[n] for n in case.differentiable]
    g = torch.Generator(device="cpu").manual_seed(seed + 1)

    def forward():
        return flatten(fn(**args))[:case.n_returned]

    if not inputs:  # a forward-only card (DIFFERENTIABLE = ()): its whole step is the forward
        return forward, forward
    outs = None

    def forward_backward():
        nonlocal outs
        result = forward()
        if outs is None:  # the upstream gradient is drawn once, from the first call's shapes
            outs = [torch.randn(o.shape, generator=g).to(o.device, o.dtype) for o in result]
        torch.autograd.grad(result, inputs, outs)

    return forward, forward_backward


# ---------------------------------------------------------------------------------------
# Warm or cold: which on-disk cache a level's first call can hit, and whether it did.
# ---------------------------------------------------------------------------------------

def _cache_dirs(level: str, device: torch.device) -> list[Path]:
    if level == "compile":
        # Inductor keeps its generated C++/Triton, and on a GPU Triton's binaries, here
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        return [Path(cache_dir())]
    if level == "triton" and device.type == "cuda":
        return [triton_cache_dir()[0]]  # the level ran, so triton is imported and answers
    return []


def _count_files(dirs: list[Path]) -> int:
    return sum(len(files) for d in dirs for _, _, files in os.walk(d))


def _level5_build_report():
    """Level 5 reports its own build (load_inline's cache is keyed by source and flags)."""
    try:
        from cuda_kernels.build import last_build
    except Exception:  # noqa: BLE001 - an older build module, or none: we cannot tell
        return None
    return last_build


def _level5_cache(last_build, before: dict | None) -> tuple[str, str]:
    if last_build is None:
        return "unknown", "cuda_kernels.build reports no last_build()"
    after = last_build()
    if not after or "cached" not in after:
        return "unknown", "cuda_kernels.build.last_build() says nothing about its cache"
    if after == before:  # built (or loaded) before this call: nothing to build now
        return "warm", f"already loaded in this process from {after.get('dir', '?')}"
    return ("warm" if after["cached"] else "cold"), str(after.get("dir", ""))


def _timed_first_call(p: Profile, level: str, fn, device: torch.device) -> None:
    dirs = _cache_dirs(level, device)
    before = _count_files(dirs) if dirs else 0
    last_build = _level5_build_report() if level == "cuda" else None
    build_before = last_build() if last_build else None
    p.first_call_ms = time_first_call(fn, device)
    if dirs:
        gained = _count_files(dirs) - before
        p.first_call_cache = "cold" if gained > 0 else "warm"
        p.first_call_cache_detail = f"{', '.join(map(str, dirs))} gained {gained} file(s)"
    elif level == "cuda":
        p.first_call_cache, p.first_call_cache_detail = _level5_cache(last_build, build_before)


def _trace(fn, device: torch.device, path: Path, label: str) -> str:
    from torch.profiler import ProfilerActivity, profile as torch_profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        for i in range(3):
            with record_function(f"{label} #{i + 1}"):  # one labelled span per call in the viewer
                fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return str(path)


def profile(component: str, level=None, dtype="float32", device="cpu", size="small",
            variant: str | None = None, seed: int | None = None, min_time_s: float = 0.3,
            host_size: str | None = None, ceilings=None, trace_dir=None, *, fn=None,
            case_cache: dict | None = None) -> Profile:
    """Profile one level, or your function `fn`, on one component (see the module doc).

    host_size: also time this size preset end to end, calls back to back ("tiny": the
    per-call overhead). ceilings: an equivalence.ceilings.Ceilings to express the rates as
    fractions of. trace_dir: write a torch.profiler Chrome trace of three fwd+bwd calls
    there, as <component>-<level>.json (open it in https://ui.perfetto.dev). case_cache: a
    dict kept across calls to reuse one draw of inputs (see _case; `compare` passes one)."""
    target = _target(component, level, fn)
    dtype = resolve_dtype(dtype)
    device = torch.device(device)
    card = cards.get(component)
    variant = variant or next(iter(card.variants))
    seed = fresh_seed() if seed is None else seed
    start = time.perf_counter()
    case = _case(card, size, variant, dtype, device, seed, case_cache)
    drawn = time.perf_counter()
    name, reason, module = _open(target, device, component)
    p = Profile(component, name, variant, dtype_name(dtype), str(device),
                size if isinstance(size, str) else "custom", case.shapes(), status="skip",
                flops=card.flops(case.args), min_bytes=card.min_bytes(case.args),
                ceilings=ceilings.to_dict() if ceilings is not None else None)
    if reason:
        p.reason = reason
        return p
    if getattr(module, "INTERPRETED", False):
        # An interpreter emulates the GPU program in NumPy: its time says nothing about the
        # kernel, and at this size it would take minutes. Checked, not timed.
        p.status, p.reason = "untimed", "Triton's CPU interpreter is an emulation, not a speed"
        return p
    fn = getattr(module, component)
    # "draw": the case's random inputs (reused from the previous row when they match);
    # "open": importing or building the level; "inputs": this level's own copies
    p.wall_s["draw"] = round(drawn - start, 3)
    lap = _Laps(p.wall_s, drawn)
    lap("open")
    forward, forward_backward = _passes(fn, case, seed)
    lap("inputs")
    try:
        _timed_first_call(p, name, forward_backward, device)
        lap("first_call")
        p.fwd = time_fn(forward, device, min_time_s=min_time_s).to_dict()
        lap("fwd")
        p.fwd_bwd = time_fn(forward_backward, device, min_time_s=min_time_s).to_dict()
        lap("fwd_bwd")
        p.peak_memory_mb = peak_memory_mb(forward_backward, device)
        lap("memory")
        if host_size is not None:
            small = card.case(host_size, variant, dtype, device, seed)
            p.host = time_host(_passes(fn, small, seed)[1], device,
                               min_time_s=min(min_time_s, 0.2)).to_dict()
            p.host["size"] = host_size
        if trace_dir is not None:
            file_name = name.replace(":", "-")  # fn:my_layer_norm
            p.trace = _trace(forward_backward, device,
                             Path(trace_dir) / f"{component}-{file_name}.json",
                             f"{component} {name} fwd+bwd")
        lap("host_and_trace")
    except Exception as exc:  # noqa: BLE001 - reported, never hidden
        p.status, p.reason = "error", f"{type(exc).__name__}: {exc}"
        return p
    p.status = "ok"
    return p


def _spread(timing: dict) -> tuple[float, float]:
    """The p20–p80 interval of a timing (a timing without one: its median, exactly)."""
    return timing.get("p20_ms", timing["median_ms"]), timing.get("p80_ms", timing["median_ms"])


def overlap(a: dict, b: dict) -> bool:
    """Whether two timings' p20–p80 intervals overlap: then the timing cannot tell which is
    faster, and a verdict either way would flip between runs (it did: a break-even of 16
    calls in one run was "never" in the next, from the same code)."""
    (alo, ahi), (blo, bhi) = _spread(a), _spread(b)
    return alo <= bhi and blo <= ahi and (ahi > alo or bhi > blo)


def speedup_spread(level: Profile | dict, baseline: Profile | dict, which: str = "fwd_bwd"):
    """(low, median, high) of a level's speed-up over `baseline`: the medians' ratio, and the
    ratio at the two ends of the intervals (baseline's p20 over the level's p80, and the
    other way round); None if either was not timed."""
    a, b = (getattr(x, which) if isinstance(x, Profile) else x.get(which) for x in (level, baseline))
    if not a or not b:
        return None
    (alo, ahi), (blo, bhi) = _spread(a), _spread(b)
    return blo / ahi, b["median_ms"] / a["median_ms"], bhi / alo


def break_even_calls(level: Profile, baseline: Profile) -> int | str | None:
    """After how many calls a level's cold start has paid for itself against `baseline`.

    The smallest n with  first + (n-1)*steady  <=  n * baseline_steady  (fwd+bwd medians).
    SAME ("≈") if the two fwd+bwd p20–p80 intervals overlap: neither is measurably faster,
    and a count would be noise. NEVER ("never") if the level is slower in steady state:
    then no number of calls pays for its first one, however cheap that was. None if either
    was not timed. (Timings without a spread are compared by their medians alone.)"""
    if level.status != "ok" or baseline.status != "ok":
        return None
    if overlap(level.fwd_bwd, baseline.fwd_bwd):
        return SAME
    steady, base = level.fwd_bwd["median_ms"], baseline.fwd_bwd["median_ms"]
    if steady >= base:
        return NEVER
    if level.first_call_ms <= base:
        return 1
    return math.ceil((level.first_call_ms - steady) / (base - steady))


# ---------------------------------------------------------------------------------------
# Scaling: one dimension of a size preset stretched, everything else as it is.
# ---------------------------------------------------------------------------------------

SCALING_FACTORS = (1 / 8, 1 / 4, 1 / 2, 1, 2)


def scaling(component: str, level=None, dtype="float32", device="cpu", size="small",
            variant: str | None = None, seed: int | None = None, factors=SCALING_FACTORS,
            min_time_s: float = 0.1, *, fn=None) -> tuple[str, list[dict]]:
    """Profile `level` (or your function `fn`) at `size` with its scaling dimension times
    each factor.
    Returns (dimension, points); a point is {"level", "value", "shape", "status", "fwd",
    "fwd_bwd", "first_call_ms"}. Every new shape is a new compile for Level 3."""
    card = cards.get(component)
    dim = card.scaling_dim  # the dimension a user grows first (the card's SCALING_DIM)
    points = []
    for factor in factors:
        shape = dict(card.sizes[size])
        if isinstance(shape[dim], tuple):  # leading "rows" dimensions: stretch the first
            shape[dim] = (max(1, round(shape[dim][0] * factor)), *shape[dim][1:])
            value = shape[dim][0]
        else:
            shape[dim] = value = max(1, round(shape[dim] * factor))
        p = profile(component, level, dtype, device, shape, variant, seed, min_time_s, fn=fn)
        points.append({"level": p.level, "value": value, "shape": shape, "status": p.status,
                       "reason": p.reason, "fwd": p.fwd, "fwd_bwd": p.fwd_bwd,
                       "first_call_ms": p.first_call_ms})
    return dim, points
