"""Where `levels bench --suite` and `--overhead` write their reports, and what each records
about the machine it ran on."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch

from ... import environment


def gpu_slug(name: str) -> str:
    """A GPU's marketing name as a file-name prefix: 'NVIDIA H100 80GB HBM3' -> 'h100',
    'NVIDIA GeForce RTX 4090' -> 'rtx-4090': the words up to the first with a digit (the
    model, not the memory size)."""
    words = [w for w in re.split(r"[\s_\-]+", name.lower())
             if w and w not in ("nvidia", "geforce", "tesla")]
    kept = []
    for w in words:
        kept.append(re.sub(r"[^a-z0-9.]", "", w))
        if any(ch.isdigit() for ch in w):
            break
    return "-".join(k for k in kept if k) or "gpu"


def device_slug(device) -> str:
    """'h100', 'rtx-4090', ... for a GPU; 'cpu' for the CPU."""
    device = torch.device(device)
    return gpu_slug(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu"


def output_path(out, device, what: str) -> Path:
    """--out as given: a .json file, or a directory. Default: reports/<gpu>-<what>.json on a
    GPU (the recorded results live there), levels-reports/cpu-<what>.json on a CPU (a smoke
    run is nothing to commit next to them)."""
    name = f"{device_slug(device)}-{what}.json"
    if out is None:
        return Path("reports" if torch.device(device).type == "cuda" else "levels-reports") / name
    out = Path(out)
    return out if out.suffix == ".json" else out / name


def write_report(report: dict, path: Path) -> None:
    # written whole and renamed: a run cut short leaves the last complete file, never half
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(report), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _finite(value):
    """The report with every inf/NaN float as a string ("inf"): JSON has no such numbers
    (Python would write a bare Infinity, which other readers reject)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def report_environment(device) -> dict:
    """environment.describe, and on a GPU cuDNN's version (the suite's baselines call it)."""
    env = environment.describe(device)
    if torch.device(device).type == "cuda":
        env["cudnn"] = torch.backends.cudnn.version()
    return env
