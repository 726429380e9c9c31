"""What this device can do at best, measured here: copy bandwidth and matmul rate.

A level's achieved TFLOP/s or TB/s means little alone; as a fraction of what the same
device reaches on the simplest possible work it says how much is left. Both ceilings are
measured, never taken from a datasheet: a datasheet's peak assumes clocks, sparsity or
instruction mixes that nobody's code gets, and on a CPU there is no datasheet figure for
"this laptop with these 2 threads".

  copy    dst.copy_(src) of a buffer larger than the last-level cache: bytes read + written
  matmul  one square GEMM in the dtype asked about (library call: cuBLAS, oneDNN/MKL)

A measurement on a busy machine is low, and a low ceiling makes every level look better
than it is (a 2-core CPU measured under load once gave `153% of matmul`). So each is the
best of ROUNDS rounds (load only ever slows a round down), checked against what the device
can do on paper (`known_figures`: the datasheet's figures of the GPUs we know, a CPU's
cores × clock × FLOPs per cycle): a result outside PLAUSIBLE of that is measured again, up
to MAX_ROUNDS, and kept with a note if it stays outside. A fraction of a roof above 100% is
then a finding, and `levels profile` says so and measures again (`--remeasure` on demand).

They are kept per device (its name, thread count on a CPU), torch version, CUDA runtime and
driver in `<cache>/ceilings.json` (a new torch or driver measures again); the cache is
~/.cache/levels (or $XDG_CACHE_HOME/levels, or $LEVELS_CACHE_DIR: equivalence/settings.py).
`get(..., remeasure=True)` or deleting the file measures again.
"""

from __future__ import annotations

import datetime
import json
import platform
from dataclasses import asdict, dataclass, field
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
    measured: str = ""  # when (UTC)
    doubts: list = field(default_factory=list)  # what the plausibility check found, if anything

    def to_dict(self) -> dict:
        return asdict(self)

    def fractions(self, tflops: float | None, tbps: float | None) -> dict:
        """Achieved rates as fractions of the ceilings."""
        return {"of_matmul": tflops / self.matmul_tflops if tflops is not None else None,
                "of_copy": tbps / self.copy_tbps if tbps is not None else None}


# Dense datasheet figures (no sparsity) of the GPUs this has run on or is likely to: copy in
# TB/s (memory bandwidth), matmul in TFLOP/s per dtype (float32 without TF32). The first
# name a device's name contains wins: the specific before the general.
GPU_FIGURES = (
    ("H100 PCIe", 2.0, {"float32": 51, "bfloat16": 756, "float16": 756}),
    ("H100 NVL", 3.9, {"float32": 60, "bfloat16": 835, "float16": 835}),
    ("H100", 3.35, {"float32": 67, "bfloat16": 989, "float16": 989}),
    ("H200", 4.8, {"float32": 67, "bfloat16": 989, "float16": 989}),
    ("A100-SXM4-40GB", 1.555, {"float32": 19.5, "bfloat16": 312, "float16": 312}),
    ("A100", 2.039, {"float32": 19.5, "bfloat16": 312, "float16": 312}),
    ("L4", 0.3, {"float32": 30.3, "bfloat16": 121, "float16": 121}),
    ("A10", 0.6, {"float32": 31.2, "bfloat16": 125, "float16": 125}),
    ("RTX 4090", 1.008, {"float32": 82.6, "bfloat16": 165, "float16": 165}),
    ("T4", 0.32, {"float32": 8.1, "float16": 65}),
    ("V100", 0.9, {"float32": 15.7, "float16": 125}),
)
# Measured / on paper: below the floor the machine was busy (measure again), above the
# ceiling the measurement is wrong. A CPU's paper figure is a generous upper bound (every
# core at its listed clock, every cycle a full vector FMA), so its floor is low.
PLAUSIBLE = {"cuda": (0.35, 1.1), "cpu": (0.05, 1.1)}
ROUNDS, MAX_ROUNDS = 2, 5


def _cpu_peak_tflops(dtype_name: str) -> tuple[float, str] | None:
    """threads × clock × FLOPs per cycle of the widest FMA /proc/cpuinfo lists (fp32; bf16
    only where the CPU has bf16 arithmetic: AMX or AVX512-BF16, else it is emulated)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                      if ln.startswith("flags")), []))
    mhz = [float(ln.split(":", 1)[1]) for ln in info.splitlines() if ln.startswith("cpu MHz")]
    if not mhz:
        return None
    ghz = max(mhz) / 1e3 * 1.5  # the listed clock is often the base: leave room for boost
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16
    if dtype_name != "float32":
        if not flags & {"amx_bf16", "avx512_bf16"}:
            return None  # emulated: no paper figure worth checking against
        per_cycle *= 16 if "amx_bf16" in flags else 2
    threads = torch.get_num_threads()
    return (threads * ghz * per_cycle / 1e3,
            f"{threads} threads × {ghz:.2f} GHz × {per_cycle} FLOP/cycle ({dtype_name})")


def known_figures(device, dtype_name: str) -> dict:
    """What the device can do on paper: {"copy_tbps", "matmul_tflops", "source"}, each
    figure None where nothing is known."""
    device = torch.device(device)
    if device.type == "cuda":
        name = device_name(device)
        for key, copy, matmul in GPU_FIGURES:
            if key in name:
                return {"copy_tbps": copy, "matmul_tflops": matmul.get(dtype_name),
                        "source": f"{key} datasheet"}
        return {"copy_tbps": None, "matmul_tflops": None, "source": f"no figures for {name}"}
    peak = _cpu_peak_tflops(dtype_name)
    return {"copy_tbps": None, "matmul_tflops": peak[0] if peak else None,
            "source": peak[1] if peak else "no figures for this CPU"}


def _doubt(what: str, measured: float, paper: float | None, device) -> str:
    """Why `measured` is implausible against `paper`, or "" if it is not."""
    if paper is None:
        return ""
    low, high = PLAUSIBLE["cuda" if torch.device(device).type == "cuda" else "cpu"]
    ratio = measured / paper
    if ratio < low:
        return (f"{what} {measured:.3g} is {ratio:.0%} of the {paper:.3g} on paper: measured on a "
                f"busy machine? (`levels profile --remeasure` on a quiet one)")
    if ratio > high:
        return f"{what} {measured:.3g} is {ratio:.0%} of the {paper:.3g} on paper: a timing error?"
    return ""


def _measure(device: torch.device, dtype: torch.dtype, name: str, copy_too: bool):
    """(copy TB/s or None, matmul TFLOP/s, doubts): the best of ROUNDS rounds, more (up to
    MAX_ROUNDS) while either is implausible against the device's figures."""
    paper = known_figures(device, name)
    copies, matmuls = [], []
    for done in range(1, MAX_ROUNDS + 1):
        if copy_too:
            copies.append(_measure_copy_tbps(device))
        matmuls.append(_measure_matmul_tflops(device, dtype))
        doubts = [d for d in (_doubt("copy TB/s", max(copies), paper["copy_tbps"], device)
                              if copies else "",
                              _doubt(f"{name} matmul TFLOP/s", max(matmuls), paper["matmul_tflops"],
                                     device)) if d]
        if done >= ROUNDS and not doubts:
            break
    if doubts:
        doubts = [f"{d} [after {done} rounds; paper: {paper['source']}]" for d in doubts]
    return (max(copies) if copies else None), max(matmuls), doubts


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


def cache_key(device) -> str:
    """The device, and what its figures depend on besides: torch, its CUDA and the driver."""
    device = torch.device(device)
    key = f"{device_name(device)} | torch {torch.__version__}"
    if device.type == "cuda":
        driver = getattr(torch._C, "_cuda_getDriverVersion", lambda: "unknown")()
        key += f" | CUDA {torch.version.cuda} | driver {driver}"
    return key


def get(device, dtype=torch.float32, settings: Settings | None = None,
        remeasure: bool = False) -> Ceilings:
    """This device's ceilings for `dtype`, from the cache (in `settings.cache_dir`; default:
    this process's settings) or measured now (a second or two; always with `remeasure`)."""
    from .check import dtype_name, resolve_dtype

    device, dtype = torch.device(device), resolve_dtype(dtype)
    name = dtype_name(dtype)
    path = (settings or current()).cache_path("ceilings.json")
    key = cache_key(device)
    data = _load(path)
    entry = {} if remeasure else data.get(key, {})
    source = str(path)
    if "copy_tbps" not in entry or name not in entry.get("matmul_tflops", {}):
        copy, matmul, doubts = _measure(device, dtype, name, copy_too="copy_tbps" not in entry)
        entry.setdefault("matmul_tflops", {})[name] = matmul
        entry["copy_tbps"] = entry.get("copy_tbps") or copy
        entry.setdefault("doubts", {})[name] = doubts
        entry["measured"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        data[key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=2))
        except OSError:
            pass  # a read-only home still gets its figures, just not remembered
        source = "measured now"
    return Ceilings(key, name, entry["copy_tbps"], entry["matmul_tflops"][name], source,
                    entry.get("measured", ""), entry.get("doubts", {}).get(name, []))
