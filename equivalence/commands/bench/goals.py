"""`levels bench`: the speed goals, each a ratio to a baseline timed in the same run.

One module per component (`equivalence/commands/bench/<component>.py`, found by its name)
defines

    def run(device) -> list[Figure]
    def unavailable_reason(device) -> str | None   (optional; default: needs a CUDA GPU)

timing its level(s) and the baselines the goals name (eager PyTorch, torch.compile,
cuDNN, SDPA backends, a plain copy for bandwidth) in the same process, with
`equivalence.timing.time_fn`. A goal is a ratio `ours / baseline` (of throughput) that
must reach `goal`; `met` says whether it did. Figures are data; nothing here asserts.
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from levels.contract import COMPONENTS

from ... import environment
from ...timing import time_first_call, time_fn


@dataclass
class Figure:
    component: str
    name: str  # e.g. "forward fp32 16384x4096"
    level: str
    dtype: str
    shape: dict
    ms: float  # median
    spread_ms: tuple[float, float]  # 20th and 80th percentile
    tflops: float | None = None
    tbps: float | None = None
    baseline: str | None = None  # what the ratio is against
    baseline_ms: float | None = None
    ratio: float | None = None  # baseline_ms / ms: > 1 means faster than the baseline
    goal: float | None = None
    met: bool | None = None
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def needs_cuda(device) -> str | None:
    """The usual `unavailable_reason` of a benchmark module: the goals are GPU figures."""
    if torch.device(device).type != "cuda":
        return "the speed goals are H100 figures: needs a CUDA GPU"
    return None


def figure(component, name, level, dtype, shape, fn, device, *, flops=None, nbytes=None,
           baseline=None, baseline_ms=None, goal=None, notes="", extra=None,
           prime=False) -> Figure:
    """Time `fn` (its first call separately, then the steady state) into a Figure.
    prime=True: `ms` is kernel time (equivalence.timing), and the end-to-end median, CPU
    enqueue included, goes to extra["end_to_end_ms"]."""
    first_ms = time_first_call(fn, device)
    t = time_fn(fn, device, prime=prime)
    extra = {"timing": t.method, "cpu_enqueue_ms": t.cpu_enqueue_ms} | (extra or {})
    if prime:
        extra["end_to_end_ms"] = time_fn(fn, device).median_ms
    ratio = baseline_ms / t.median_ms if baseline_ms else None
    return Figure(component=component, name=name, level=level,
                  dtype=str(dtype).replace("torch.", ""), shape=dict(shape), ms=t.median_ms,
                  spread_ms=(t.p20_ms, t.p80_ms),
                  tflops=flops / (t.median_ms * 1e-3) / 1e12 if flops else None,
                  tbps=nbytes / (t.median_ms * 1e-3) / 1e12 if nbytes else None,
                  baseline=baseline, baseline_ms=baseline_ms, ratio=ratio, goal=goal,
                  met=(ratio >= goal) if (goal is not None and ratio is not None) else None,
                  notes=notes, extra={"first_call_ms": first_ms, "runs": t.runs} | (extra or {}))


def copy_tbps(nbytes: int, device, dtype=torch.float32, prime=False) -> float:
    """Bandwidth of a device-to-device copy of `nbytes` (read + write), in TB/s."""
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    src = torch.randn(n, device=device).to(dtype)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device, prime=prime)
    return 2 * n * src.element_size() / (t.median_ms * 1e-3) / 1e12


def one_call_ms(fn, device) -> float:
    """One synchronized call, end to end: the first call (a build, a compile) or a version
    too slow to time repeatedly."""
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def _module_name(component: str) -> str:
    return f"{__package__}.{component}"


def available() -> list[str]:
    found = []
    for c in COMPONENTS:
        try:
            importlib.import_module(_module_name(c))
            found.append(c)
        except ModuleNotFoundError as exc:
            if exc.name != _module_name(c):
                raise
    return found


def run(components=None, device=None, out_dir: str | Path | None = None) -> dict:
    device = torch.device(device) if device else environment.default_device()
    report = {"environment": environment.describe(device), "figures": [], "skipped": {}}
    for c in components or COMPONENTS:
        if c not in available():
            report["skipped"][c] = "no benchmark module for this component yet"
            continue
        module = importlib.import_module(_module_name(c))
        reason = getattr(module, "unavailable_reason", needs_cuda)(device)
        if reason:
            report["skipped"][c] = reason
            continue
        report["figures"] += [f.to_dict() for f in module.run(device)]
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report
