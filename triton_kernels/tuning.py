"""Autotuning by shape bucket, remembered on disk: what LEVELS_TRITON_AUTOTUNE=1 does.

Level 4 chooses its GEMM and convolution tiles by size rules (gemm.tile_for, small_m_tile,
split_k_for; conv_bn._fwd_tile): no benchmark, so a first call compiles only what it runs.
LEVELS_TRITON_AUTOTUNE=1 times candidate tiles instead, and a tuner has two costs worth
seeing: every candidate is a compile, and Triton's own `@triton.autotune` keys on exact
sizes and forgets at exit, so each new M (another batch, another sequence length)
benchmarks every candidate again, in every process. Here:

- the key is a *bucket*: each size rounded up to a power of two, with the dtype, the
  epilogue and the operands' layouts; M = 1000 and M = 1020 share the winner of whichever
  came first;
- the winner is kept in <cache>/triton-tiles.json (~/.cache/levels, or $LEVELS_CACHE_DIR),
  under this GPU's name and Triton's version, so a later process looks it up and launches
  it: no benchmark, and no compile either where Triton's own disk cache has the binary.

What it costs: a bucket's winner was measured at one shape of it, and another shape in the
bucket may prefer another tile (how many tiles fill the SMs changes inside a bucket: the
size rules' reason for existing). Delete the file, or its entry, to measure again. Each
candidate's time is kept beside the winner, so the file shows what was measured.
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from pathlib import Path

import torch
import triton

FILE = "triton-tiles.json"
_LOCK = threading.Lock()
_MEMORY: dict = {}  # section -> {key: entry}, loaded from the file once per section
_WARNED: list = []


def bucket(n: int) -> int:
    """n rounded up to a power of two (0 stays 0): one bucket per octave of sizes."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def layout(t: torch.Tensor) -> str:
    """How a matrix is stored, as the kernels see it: rows contiguous, columns, or neither."""
    if t.stride(-1) == 1:
        return "row"
    return "col" if t.stride(-2) == 1 else "strided"


def path() -> Path:
    root = os.environ.get("LEVELS_CACHE_DIR")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "levels"
    return Path(root) / FILE


def _section(device) -> str:
    return f"{torch.cuda.get_device_name(device)} | triton {triton.__version__}"


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _read() -> dict:
    p = path()
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        _warn_once(f"levels: Level 4's tile cache {p} is unreadable ({exc}); tiles are measured "
                   f"again and the file rewritten")
        return {}
    return data if isinstance(data, dict) else {}


def _table(section: str) -> dict:
    with _LOCK:
        if section not in _MEMORY:
            found = _read().get(section)
            _MEMORY[section] = dict(found) if isinstance(found, dict) else {}
        return _MEMORY[section]


def _save(section: str, key: str, entry: dict) -> None:
    """Merge one entry into the file (another process may have added others meanwhile)."""
    p = path()
    with _LOCK:
        data = _read()
        data.setdefault(section, {})[key] = entry
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, p)  # atomic: a reader sees the old file or the new one
        except OSError as exc:
            _warn_once(f"levels: could not write Level 4's tile cache {p} ({exc}); this process "
                       f"keeps its measurements in memory")


def pick(kind: str, key: tuple, candidates: list[dict], bench, device) -> dict:
    """The candidate `bench(candidate) -> milliseconds` finds fastest for this bucket `key`,
    measured once per bucket per GPU and Triton version and remembered (see the module doc).
    A candidate that fails to compile or launch (too much shared memory, say) is skipped;
    if all fail, the last error is raised."""
    section = _section(device)
    name = kind + "|" + "|".join(map(str, key))
    table = _table(section)
    entry = table.get(name)
    if entry is not None and entry.get("config") in candidates:
        return entry["config"]
    times, error = [], None
    for cand in candidates:
        try:
            times.append(float(bench(cand)))
        except Exception as exc:  # noqa: BLE001 - one candidate out of resources: the others stand
            times.append(math.inf)
            error = exc
    best = min(range(len(candidates)), key=times.__getitem__)
    if math.isinf(times[best]):
        raise error
    entry = {"config": candidates[best],
             "candidates": [{"config": c, "ms": None if math.isinf(t) else round(t, 5)}
                            for c, t in zip(candidates, times)]}
    with _LOCK:
        table[name] = entry
    _save(section, name, entry)
    return candidates[best]


def benchmark(fn) -> float:
    """Median milliseconds of fn() on the GPU (Triton's do_bench: warm-up, then ~25 ms)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=25, return_mode="median")
