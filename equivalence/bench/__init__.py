"""`levels bench`: the speed goals, each a ratio to a baseline timed in the same run.

One module per component (`equivalence/bench/<component>.py`) defines

    def run(device) -> list[Figure]

timing its level(s) and the baselines the goals name (eager PyTorch, torch.compile,
cuDNN, SDPA backends, a plain copy for bandwidth) in the same process, with
`equivalence.timing.time_fn`. A goal is a ratio `ours / baseline` (of throughput) that
must reach `goal`; `met` says whether it did. Figures are data; nothing here asserts.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from levels.contract import COMPONENTS

from .. import environment
from ..timing import time_fn


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


def copy_tbps(nbytes: int, device, dtype=torch.float32) -> float:
    """Bandwidth of a device-to-device copy of `nbytes` (read + write), in TB/s."""
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    src = torch.randn(n, device=device).to(dtype)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device)
    return 2 * n * src.element_size() / (t.median_ms * 1e-3) / 1e12


def available() -> list[str]:
    found = []
    for c in COMPONENTS:
        try:
            importlib.import_module(f"{__name__}.{c}")
            found.append(c)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{c}":
                raise
    return found


def run(components=None, device=None, out_dir: str | Path | None = None) -> dict:
    device = torch.device(device) if device else environment.default_device()
    report = {"environment": environment.describe(device), "figures": [], "skipped": {}}
    for c in components or COMPONENTS:
        if c not in available():
            report["skipped"][c] = "no benchmark module for this component yet"
            continue
        module = importlib.import_module(f"{__name__}.{c}")
        reason = getattr(module, "unavailable_reason", lambda d: None)(device)
        if reason:
            report["skipped"][c] = reason
            continue
        report["figures"] += [f.to_dict() for f in module.run(device)]
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report
