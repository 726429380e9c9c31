"""Profiling one level on one component: cold start, steady state, memory, throughput.

Two passes are timed, both with inputs that require grad (what training does):
  fwd      the forward call
  fwd+bwd  forward, then backward driven by a fixed random upstream gradient
The very first fwd+bwd call is timed on its own (`first_call_ms`): for torch.compile it
holds the compilation of both graphs, for Triton the JIT, for CUDA C++ the build.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

import levels

from . import specs
from .check import _prepare, dtype_name, flatten, fresh_seed, resolve_dtype
from .timing import peak_memory_mb, time_first_call, time_fn


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
    fwd: dict | None = None
    fwd_bwd: dict | None = None
    peak_memory_mb: float | None = None
    flops: dict = field(default_factory=dict)
    min_bytes: dict = field(default_factory=dict)
    notes: str = ""

    def throughput(self, which: str = "fwd") -> dict:
        """Achieved TFLOP/s and TB/s of a pass (from the spec's FLOPs and minimum bytes)."""
        timing = self.fwd if which == "fwd" else self.fwd_bwd
        if not timing:
            return {}
        seconds = timing["median_ms"] * 1e-3
        fl = self.flops["fwd"] + (self.flops["bwd"] if which != "fwd" else 0)
        by = self.min_bytes["fwd"] + (self.min_bytes["bwd"] if which != "fwd" else 0)
        return {"tflops": fl / seconds / 1e12, "tbps": by / seconds / 1e12}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["throughput"] = {"fwd": self.throughput("fwd"), "fwd_bwd": self.throughput("fwd+bwd")}
        return d


def _passes(fn, case: specs.Case, seed: int):
    """Closures for one forward, and one forward+backward, on fixed inputs."""
    args, _ = _prepare(case)
    inputs = [args[n] for n in case.differentiable]
    g = torch.Generator(device="cpu").manual_seed(seed + 1)

    def forward():
        return flatten(fn(**args))[:case.n_returned]

    outs = None

    def forward_backward():
        nonlocal outs
        result = forward()
        if outs is None:  # the upstream gradient is drawn once, from the first call's shapes
            outs = [torch.randn(o.shape, generator=g).to(o.device, o.dtype) for o in result]
        torch.autograd.grad(result, inputs, outs)

    return forward, forward_backward


def profile(component: str, level, dtype="float32", device="cpu", size="small",
            variant: str | None = None, seed: int | None = None, min_time_s: float = 0.3) -> Profile:
    info = levels.resolve(level)
    dtype = resolve_dtype(dtype)
    device = torch.device(device)
    spec = specs.get(component)
    variant = variant or next(iter(spec.variants))
    seed = fresh_seed() if seed is None else seed
    case = spec.case(size, variant, dtype, device, seed)
    p = Profile(component, info.name, variant, dtype_name(dtype), str(device), size, case.shapes(),
                status="skip", flops=spec.flops(case.args), min_bytes=spec.min_bytes(case.args))
    reason = levels.status(info.name, device, component)
    if reason:
        p.reason = reason
        return p
    module = levels.get(info.name)
    if getattr(module, "INTERPRETED", False):
        # An interpreter emulates the GPU program in NumPy: its time says nothing about the
        # kernel, and at this size it would take minutes. Checked, not timed.
        p.status, p.reason = "untimed", "Triton's CPU interpreter is an emulation, not a speed"
        return p
    forward, forward_backward = _passes(getattr(module, component), case, seed)
    try:
        p.first_call_ms = time_first_call(forward_backward, device)
        p.fwd = time_fn(forward, device, min_time_s=min_time_s).to_dict()
        p.fwd_bwd = time_fn(forward_backward, device, min_time_s=min_time_s).to_dict()
        p.peak_memory_mb = peak_memory_mb(forward_backward, device)
    except Exception as exc:  # noqa: BLE001 - reported, never hidden
        p.status, p.reason = "error", f"{type(exc).__name__}: {exc}"
        return p
    p.status = "ok"
    return p


def break_even_calls(level: Profile, baseline: Profile) -> float | None:
    """After how many calls a level's cold start has paid for itself against `baseline`.

    calls n such that  first + (n-1)*steady  <=  n * baseline_steady; None if the level is
    not faster in steady state (it never pays off), 1 if its first call is already cheaper."""
    if level.status != "ok" or baseline.status != "ok":
        return None
    steady, base = level.fwd_bwd["median_ms"], baseline.fwd_bwd["median_ms"]
    if level.first_call_ms <= base:
        return 1
    if steady >= base:
        return None
    return math.ceil((level.first_call_ms - steady) / (base - steady))
