"""What this device can do at best, measured here: copy bandwidth and matmul rate.

A level's achieved TFLOP/s or TB/s means little alone; as a fraction of what the same
device reaches on the simplest possible work it says how much is left. Both ceilings are
measured, never taken from a datasheet: a datasheet's peak assumes clocks, sparsity or
instruction mixes that nobody's code gets, and on a CPU there is no datasheet figure for
"this laptop with these 2 threads".

  copy    dst.copy_(src) of a buffer larger than the last-level cache: bytes read + written
  matmul  one square GEMM in the dtype asked about (library call: cuBLAS, oneDNN/MKL)

They are measured once per device (its name, thread count on a CPU) and torch version, and
kept in `<cache>/ceilings.json`; the cache is ~/.cache/levels (or $XDG_CACHE_HOME/levels,
or $LEVELS_CACHE_DIR: equivalence/settings.py). Delete the file to measure again.
"""

from __future__ import annotations

import datetime
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .settings import Settings, current
from .timing import time_fn


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # the same CPU with fewer threads is a slower device as far as every figure goes
    return f"{model} ({torch.get_num_threads()} threads)"


@dataclass
class Ceilings:
    device: str  # the device's name, as keyed in the cache
    dtype: str
    copy_tbps: float
    matmul_tflops: float
    source: str  # "measured now" or the cache file it came from

    def to_dict(self) -> dict:
        return asdict(self)

    def fractions(self, tflops: float | None, tbps: float | None) -> dict:
        """Achieved rates as fractions of the ceilings."""
        return {"of_matmul": tflops / self.matmul_tflops if tflops is not None else None,
                "of_copy": tbps / self.copy_tbps if tbps is not None else None}


def _measure_copy_tbps(device: torch.device) -> float:
    # larger than any last-level cache we run on, or the copy measures the cache
    nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device, min_time_s=0.2)
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e12


def _measure_matmul_tflops(device: torch.device, dtype: torch.dtype) -> float:
    # big enough that the GEMM runs at its steady rate, small enough to measure in well
    # under a second on 2 CPU cores (a CPU's bf16/fp16 GEMM can be 10x slower than fp32)
    n = 8192 if device.type == "cuda" else (1024 if dtype == torch.float32 else 512)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t = time_fn(lambda: a @ b, device, min_time_s=0.2)
    return 2 * n ** 3 / (t.median_ms * 1e-3) / 1e12


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: measure again


def get(device, dtype=torch.float32, settings: Settings | None = None) -> Ceilings:
    """This device's ceilings for `dtype`, from the cache (in `settings.cache_dir`; default:
    this process's settings) or measured now (about a second)."""
    from .check import dtype_name, resolve_dtype

    device, dtype = torch.device(device), resolve_dtype(dtype)
    path = (settings or current()).cache_path("ceilings.json")
    key = f"{device_name(device)} | torch {torch.__version__}"
    data = _load(path)
    entry = data.get(key, {})
    source = str(path)
    if "copy_tbps" not in entry or dtype_name(dtype) not in entry.get("matmul_tflops", {}):
        entry.setdefault("matmul_tflops", {})
        entry["copy_tbps"] = entry.get("copy_tbps") or _measure_copy_tbps(device)
        entry["matmul_tflops"][dtype_name(dtype)] = _measure_matmul_tflops(device, dtype)
        entry["measured"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        data[key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=2))
        except OSError:
            pass  # a read-only home still gets its figures, just not remembered
        source = "measured now"
    return Ceilings(key, dtype_name(dtype), entry["copy_tbps"],
                    entry["matmul_tflops"][dtype_name(dtype)], source)
