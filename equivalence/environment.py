"""What a report was measured on: every JSON under reports/ carries this."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path

import torch


def describe(device="cpu") -> dict:
    device = torch.device(device)
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "cuda": torch.version.cuda,
                 "compute_capability": f"{props.major}.{props.minor}",
                 "gpu_memory_gib": round(props.total_memory / 2 ** 30, 1),
                 "sm_count": props.multi_processor_count}
    return info


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(value: str | None) -> torch.device:
    """A --device value as a torch.device (None: the default device). A malformed name, or a
    device type the levels do not run on, is a ValueError naming the choices; whether this
    machine has that device is the caller's question (`levels doctor` diagnoses it, the
    other commands refuse it)."""
    if value is None:
        return default_device()
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"argument '--device' must be cpu, cuda or cuda:N; got {value!r}")
    return device


def triton_cache_dir() -> tuple[Path, str]:
    """Where Triton keeps what it compiled, and who says so: "$TRITON_CACHE_DIR", "triton"
    (its own answer, once it is imported) or "default" (its rule: $TRITON_HOME, else the
    home directory, then .triton/cache). Triton is not imported to ask: importing it decides
    for the whole process whether Level 4 runs compiled or in the interpreter."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"]), "$TRITON_CACHE_DIR"
    if "triton" in sys.modules:
        try:
            return Path(sys.modules["triton"].knobs.cache.dir), "triton"
        except AttributeError:  # triton before 3.4 had no knobs
            pass
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return Path(home) / ".triton" / "cache", "default"
