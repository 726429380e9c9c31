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
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from levels.contract import COMPONENTS

from ... import environment
from ...timing import quantile, time_first_call, time_fn


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
    return _figure(component, name, level, dtype, shape, t.median_ms, (t.p20_ms, t.p80_ms),
                   flops, nbytes, baseline, baseline_ms, goal, notes,
                   {"first_call_ms": first_ms, "runs": t.runs} | extra)


def _figure(component, name, level, dtype, shape, ms, spread, flops, nbytes, baseline,
            baseline_ms, goal, notes, extra) -> Figure:
    """A Figure from a measured median: its rates, and its ratio to the baseline's median."""
    ratio = baseline_ms / ms if baseline_ms else None
    return Figure(component=component, name=name, level=level,
                  dtype=str(dtype).replace("torch.", ""), shape=dict(shape), ms=ms,
                  spread_ms=spread, tflops=flops / (ms * 1e-3) / 1e12 if flops else None,
                  tbps=nbytes / (ms * 1e-3) / 1e12 if nbytes else None,
                  baseline=baseline, baseline_ms=baseline_ms, ratio=ratio, goal=goal,
                  met=(ratio >= goal) if (goal is not None and ratio is not None) else None,
                  notes=notes, extra=extra)


ROUNDS = 6  # figures_in_rounds: rounds per side (the order rotated each round)


def sm_clock_mhz(device) -> int | None:
    """The GPU's SM clock now (NVML, through torch), or None where it cannot be read."""
    if torch.device(device).type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(torch.device(device)))
    except Exception:  # noqa: BLE001 - no NVML (pynvml) here: the clock is simply not read
        return None


def figures_in_rounds(specs: list[dict], device, rounds: int = ROUNDS,
                      prime: bool = False) -> list[Figure]:
    """`figure` for several sides of one comparison, timed in turns: each side's first call
    on its own, then `rounds` rounds in which every side is timed once (time_fn), the order
    rotated each round. A side's `ms` is the median of its rounds' medians and its spread
    their 20th/80th percentiles; the SM clock read before each of its rounds goes to
    extra["sm_mhz"]. Each spec holds figure()'s arguments (component, name, level, dtype,
    shape, fn; flops, nbytes, notes, goal) and, for a side with a goal, `baseline` (what the
    ratio is against, for the report) and `against`: the index in `specs` of its baseline.
    prime=True, as figure's, for every side: `ms` is kernel time, and each side's end-to-end
    median (timed once, after the rounds) goes to extra["end_to_end_ms"].

    Why: timed one after the other, the side timed first ran on a cooler GPU. Under
    sustained bf16 GEMMs an H100 lowers its SM clock (1980 MHz idle, 1440-1680 MHz a few
    seconds in: scripts/probe_swiglu_parts.py, reports/swiglu-parts-and-clock-2026-11-27/),
    and `levels bench` timed eager first: Level 4's SwiGLU forward at Llama 3 8B measured
    0.82x eager that way and 0.91x (every round 0.89-0.93x) in rounds."""
    firsts, failed = [], set()
    for i, spec in enumerate(specs):
        try:
            firsts.append(time_first_call(spec["fn"], device))
        except Exception as exc:  # noqa: BLE001 - one failing side must not hide the others
            firsts.append(None)
            failed.add(i)
            print(f"{spec['component']} bench: {spec['level']} {spec['name']} failed: "
                  f"{type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
    failed |= {i for i, spec in enumerate(specs) if spec.get("against") in failed}
    per_round = [[] for _ in specs]
    clocks = [[] for _ in specs]
    runs = [0 for _ in specs]
    method = ["" for _ in specs]
    order = [i for i in range(len(specs)) if i not in failed]
    for r in range(rounds if order else 0):
        for i in order[r % len(order):] + order[:r % len(order)]:
            clocks[i].append(sm_clock_mhz(device))
            t = time_fn(specs[i]["fn"], device, prime=prime)
            per_round[i].append(t.median_ms)
            runs[i] += t.runs
            method[i] = t.method
    end_to_end = {i: time_fn(specs[i]["fn"], device).median_ms for i in order} if prime else {}
    figs = []
    for i, spec in enumerate(specs):
        if i in failed:
            continue
        base = spec.get("against")
        extra = {"first_call_ms": firsts[i], "runs": runs[i], "rounds": rounds,
                 "timing": f"{method[i]}; {rounds} rounds, the order rotated",
                 "round_ms": per_round[i], "sm_mhz": clocks[i]}
        if i in end_to_end:
            extra["end_to_end_ms"] = end_to_end[i]
        if base is not None:
            extra["round_ratios"] = [b / m for b, m in zip(per_round[base], per_round[i])]
        figs.append(_figure(
            spec["component"], spec["name"], spec["level"], spec["dtype"], spec["shape"],
            statistics.median(per_round[i]),
            (quantile(per_round[i], 0.2), quantile(per_round[i], 0.8)), spec.get("flops"),
            spec.get("nbytes"), spec.get("baseline"),
            statistics.median(per_round[base]) if base is not None else None, spec.get("goal"),
            spec.get("notes", ""), extra))
    return figs


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
