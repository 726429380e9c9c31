"""What a report was measured on: every JSON under reports/ carries this."""

from __future__ import annotations

import datetime
import platform

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
