"""Where a small Level 4 call's microseconds go, piece by piece.

    from equivalence.commands.host_probe import host_breakdown, recorded_breakdown
    host_breakdown("layer_norm")        # measured now: needs a CUDA GPU
    recorded_breakdown("layer_norm")    # the same table from reports/h100-host-probe.json

At a tiny shape a GPU runs a Level 4 kernel in a few microseconds; the call takes ten times
longer, and the difference is the host's: Python, the contract's validation, allocations,
autograd.Function.apply, and Triton's launch path. This module times each of those pieces
on its own, calls back to back, at the shapes `scripts/probe_host.py` always used (a
bfloat16 layer_norm of 148 rows of 64; an MLP 64 -> 256 -> 64 on 148 rows), so a live
breakdown and the recorded one can be read side by side.

Two layers:

  probe(device)                 every raw measurement, keyed as in the recorded JSON
                                (what scripts/probe_host.py writes);
  host_breakdown(component)     the pieces of one call that add up to it (the remainder
                                named as such), the alternatives next to them, and the GPU's
                                own time for the call, each with what it is;
  recorded_breakdown(component) the same dict built from the recorded JSON.

Units: microseconds per call, medians. GPU rows: wall clock over batches of 50 calls with
one synchronize per batch (so a GPU that finishes each call before the CPU issues the next
adds nothing); CPU-only rows (validation, allocations, attribute reads): wall clock over
batches of calls, no synchronize. Timing needs a CUDA GPU without TRITON_INTERPRET: in
Triton's CPU interpreter a "launch" emulates the kernel in numpy, which says nothing about
a GPU's host path. Without one, `host_breakdown` raises HostProbeUnavailable with the
reason (`unavailable_reason` returns it without raising).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

import levels  # noqa: F401 - first: it switches Triton's interpreter on where there is no GPU

from .. import cards
from ..settings import REPOSITORY

ROOT = REPOSITORY
RECORDED = ROOT / "reports" / "h100-host-probe.json"
COMMAND = "PYTHONPATH=. python3 scripts/probe_host.py [OUTPUT.json]"
UNITS = ("microseconds per call: host time, calls back to back (GPU rows: one synchronize per "
         "batch of 50)")
PROBED = ("layer_norm", "mlp")  # the components broken down piece by piece

# What turns "the host needs T us per call" into "the kernel needs longer above this size":
# each card's kernel rate at a large problem, measured on an H100 (an estimate: a kernel
# reaches that rate only at large sizes).
RATES_SOURCE = "reports/h100-bench.json, H100, bfloat16"


class HostProbeUnavailable(RuntimeError):
    """No CUDA GPU (or Triton's interpreter is on): there is no GPU host path to time."""


def unavailable_reason(device="cuda") -> str | None:
    """Why a live breakdown cannot be measured on `device` here, or None if it can."""
    device = torch.device(device)
    if not torch.cuda.is_available():
        return "no CUDA GPU here: torch.cuda.is_available() is False"
    if device.type != "cuda":
        return (f"the host probe times Level 4's CUDA launches, so it needs a CUDA device; "
                f"got {device}")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return ("TRITON_INTERPRET=1 in this process: Level 4 runs in Triton's CPU interpreter, "
                "whose launches are no GPU's")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not installed ({exc})"
    return None


# ---------------------------------------------------------------------------------------
# Timers (medians)
# ---------------------------------------------------------------------------------------

def _host_us(fn, batch: int = 50, reps: int = 40) -> float:
    """Median us per call of fn(), calls back to back, one synchronize per batch. A fixed
    2000 calls rather than timing.time_host's 0.2 s budget: the pieces are subtracted from
    the whole call ("the rest"), and with time_host's fewer calls the H100 run put that
    difference at -10 us of a 39 us call (noise)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t) * 1e6 / batch)
    return round(statistics.median(per), 2)


def _cpu_us(fn, batch: int = 100, reps: int = 20) -> float:
    """Median us per call of a host-only fn() (no GPU work to wait for)."""
    for _ in range(50):
        fn()
    per = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        per.append((time.perf_counter() - t) * 1e6 / batch)
    return round(statistics.median(per), 2)


@contextmanager
def _fast_launch(enabled: bool):
    """triton_kernels.launch's direct launches on or off for a moment."""
    from triton_kernels import launch as tlaunch

    saved = tlaunch.ENABLED
    tlaunch.ENABLED = enabled
    try:
        yield
    finally:
        tlaunch.ENABLED = saved


class _Recorder:
    """Measures only the keys asked for; a piece that fails is recorded as its error."""

    def __init__(self, want: Callable[[str], bool]):
        self.want, self.r = want, {}

    def host(self, key, fn, batch=50, fast_launch=True):
        if self.want(key):
            self._do(key, lambda: _host_us(fn, batch=batch), fast_launch)

    def cpu(self, key, fn):
        if self.want(key):
            self._do(key, lambda: _cpu_us(fn), True)

    def _do(self, key, measure, fast_launch):
        try:
            with _fast_launch(fast_launch):
                self.r[key] = measure()
        except Exception as exc:  # noqa: BLE001 - one piece's failure must not hide the rest
            self.r[f"{key} error"] = repr(exc)[:300]


# ---------------------------------------------------------------------------------------
# The raw probes (keys as in reports/h100-host-probe.json)
# ---------------------------------------------------------------------------------------

LAYER_NORM_SHAPES = "x (4, 37, 64), weight (64,), bias (64,), bfloat16: 148 rows of 64"
MLP_SHAPES = "x (148, 64), w1 (256, 64), w2 (64, 256), bfloat16: 148 rows, 64 -> 256 -> 64"
KERNEL_KEY = "GPU time of the call (queue primed)"


def _probe_layer_norm(dev, want) -> dict:
    import torch.nn.functional as F
    import triton
    from triton.runtime import driver

    import levels.triton as L4
    from levels.contract import validate_layer_norm
    from triton_kernels import launch as tlaunch
    from triton_kernels import layer_norm as tln

    rec = _Recorder(want)
    x = torch.randn(4, 37, 64, device=dev, dtype=torch.bfloat16)
    w = torch.randn(64, device=dev, dtype=torch.bfloat16)
    b = torch.randn(64, device=dev, dtype=torch.bfloat16)
    rec.host("eager F.layer_norm", lambda: F.layer_norm(x, (64,), w, b, 1e-5))
    with torch.no_grad():
        rec.host("eager F.layer_norm no_grad", lambda: F.layer_norm(x, (64,), w, b, 1e-5))
        rec.host("L4 levels.triton.layer_norm no_grad", lambda: L4.layer_norm(x, w, b, 1e-5))
    rec.host("L4 levels.triton.layer_norm", lambda: L4.layer_norm(x, w, b, 1e-5))
    rec.cpu("validate_layer_norm", lambda: validate_layer_norm(x, w, b, 1e-5))
    rec.cpu("_on_kernel_device", lambda: L4._on_kernel_device("layer_norm", "x", x))
    rec.host("tln.layer_norm (after validation)", lambda: tln.layer_norm(x, w, b, 1e-5))
    rec.host("_LayerNorm.apply", lambda: tln._LayerNorm.apply(x, w, b, 1e-5))
    x2 = x.reshape(-1, 64)
    M, N = x2.shape
    y = torch.empty_like(x2)
    stats = torch.empty((2, M), device=dev)
    BM, BN, nw = tln._tiling(N, 2)
    g = (triton.cdiv(M, BM),)
    args = (x2, w, b, y, stats, M, N, x2.stride(0), y.stride(0), 1e-5)
    kernel = tlaunch.jit_of(tln.layer_norm_fwd_kernel)

    def jit_launch():
        return kernel[g](*args, BLOCK_M=BM, BLOCK_N=BN, STATS=True, num_warps=nw)

    rec.host("JIT launch only", jit_launch)
    rec.host("fast launch only", lambda: tlaunch.launch(kernel, g, *args, BLOCK_M=BM,
                                                          BLOCK_N=BN, STATS=True, num_warps=nw))
    with torch.no_grad():
        rec.host("L4 levels.triton.layer_norm no_grad, fast launch OFF",
                 lambda: L4.layer_norm(x, w, b, 1e-5), fast_launch=False)
    rec.cpu("3x torch.empty", lambda: (torch.empty((M, N), device=dev, dtype=x.dtype),
                                       torch.empty((M,), device=dev, dtype=torch.float32),
                                       torch.empty((M,), device=dev, dtype=torch.float32)))
    rec.cpu("1x torch.empty", lambda: torch.empty((M, N), device=dev, dtype=x.dtype))
    rec.cpu("empty_like", lambda: torch.empty_like(x2))
    rec.cpu("x.reshape", lambda: x.reshape(-1, 64))
    rec.cpu("w.contiguous", lambda: w.contiguous())
    rec.cpu("torch.is_grad_enabled", lambda: torch.is_grad_enabled())
    rec.cpu("x.data_ptr", lambda: x.data_ptr())
    rec.cpu("x.stride(0)", lambda: x2.stride(0))
    rec.cpu("x.shape", lambda: x.shape)
    rec.cpu("torch.cuda.current_stream", lambda: torch.cuda.current_stream())
    rec.cpu("driver get_current_device", lambda: driver.active.get_current_device())
    # The compiled kernel's own launcher, without the JIT's binding, specialization and lookup
    direct = ("driver get_current_stream", "CompiledKernel[grid](...) all args", "ck.run raw")
    if any(want(k) for k in direct):
        try:
            d0 = driver.active.get_current_device()
            rec.cpu("driver get_current_stream", lambda: driver.active.get_current_stream(d0))
            ck = jit_launch()
            full = (*args, BM, BN)
            rec.host("CompiledKernel[grid](...) all args", lambda: ck[(g[0], 1, 1)](*full))
            stream = driver.active.get_current_stream(d0)
            fn, pm, run = ck.function, ck.packed_metadata, ck.run

            def raw():
                run(g[0], 1, 1, stream, fn, pm, None, None, None, *full)

            rec.host("ck.run raw", raw)
            if want("ck.run raw maxerr"):
                y.fill_(float("nan"))
                raw()
                torch.cuda.synchronize()
                ref = F.layer_norm(x2.float(), (64,), w.float(), b.float(), 1e-5)
                rec.r["ck.run raw maxerr"] = float((y.float() - ref).abs().max())
        except Exception as exc:  # noqa: BLE001 - Triton's CompiledKernel API moves
            rec.r["ck.run raw error"] = repr(exc)[:300]
    if want(KERNEL_KEY):
        rec.r.update(_kernel_us(KERNEL_KEY, lambda: L4.layer_norm(x, w, b, 1e-5), dev))
    return rec.r


def _probe_mlp(dev, want) -> dict:
    import torch.nn.functional as F

    import levels.triton as L4
    from levels.contract import validate_mlp
    from triton_kernels import gemm as tg
    from triton_kernels import mlp as tmlp

    rec = _Recorder(want)
    M, K, H, Nn = 148, 64, 256, 64
    xm = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(H, K, device=dev, dtype=torch.bfloat16) * 0.1
    b1 = torch.randn(H, device=dev, dtype=torch.bfloat16)
    w2 = torch.randn(Nn, H, device=dev, dtype=torch.bfloat16) * 0.1
    b2 = torch.randn(Nn, device=dev, dtype=torch.bfloat16)

    def eager():
        return F.linear(F.gelu(F.linear(xm, w1, b1)), w2, b2)

    with torch.no_grad():
        rec.host("eager mlp no_grad", eager)
        rec.host("L4 mlp no_grad", lambda: L4.mlp(xm, w1, b1, w2, b2))
        rec.host("L4 mlp no_grad, fast launch OFF", lambda: L4.mlp(xm, w1, b1, w2, b2),
                 fast_launch=False)
    rec.host("eager mlp", eager)
    rec.host("L4 mlp", lambda: L4.mlp(xm, w1, b1, w2, b2))
    rec.cpu("validate_mlp", lambda: validate_mlp(xm, w1, b1, w2, b2))
    rec.host("tmlp.mlp", lambda: tmlp.mlp(xm, w1, b1, w2, b2))
    out = torch.empty(M, H, device=dev, dtype=torch.bfloat16)
    rec.host("tg.gemm gelu into out", lambda: tg.gemm(xm, w1.t(), b1, activation="gelu", out=out))
    rec.host("tg.gemm gelu into out, check=False",
             lambda: tg.gemm(xm, w1.t(), b1, activation="gelu", out=out, check=False))
    rec.cpu("tg.tile_for", lambda: tg.tile_for(M, H, tg.sm_count(dev)))
    rec.cpu("tg.sm_count", lambda: tg.sm_count(dev))
    if want(KERNEL_KEY):
        with torch.no_grad():
            rec.r.update(_kernel_us(KERNEL_KEY, lambda: L4.mlp(xm, w1, b1, w2, b2), dev))
    return rec.r


def _probe_backward_and_attention(dev, want) -> dict:
    import torch.nn.functional as F

    import levels.triton as L4

    rec = _Recorder(want)
    x = torch.randn(4, 37, 64, device=dev, dtype=torch.bfloat16)
    w = torch.randn(64, device=dev, dtype=torch.bfloat16)
    b = torch.randn(64, device=dev, dtype=torch.bfloat16)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    dy = torch.randn_like(x)

    def eager_fwd_bwd():
        F.layer_norm(xg, (64,), wg, bg, 1e-5).backward(dy)

    def l4_fwd_bwd():
        L4.layer_norm(xg, wg, bg, 1e-5).backward(dy)

    rec.host("eager fwd+bwd", eager_fwd_bwd, batch=20)
    rec.host("L4 fwd+bwd", l4_fwd_bwd, batch=20)
    rec.host("L4 fwd+bwd, fast launch OFF", l4_fwd_bwd, batch=20, fast_launch=False)
    q = torch.randn(1, 2, 37, 16, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        rec.host("attn eager sdpa no_grad",
                 lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
        rec.host("attn L4 no_grad", lambda: L4.attention(q, q, q, True))
    return rec.r


def _kernel_us(key: str, fn, dev) -> dict:
    """The GPU's own time for one call (the queue held by a GPU-side sleep while Python
    enqueues, equivalence.timing), so the host's pace is not in it."""
    from ..timing import time_fn

    try:
        return {key: round(time_fn(fn, dev, min_time_s=0.2, prime=True).median_ms * 1e3, 2)}
    except Exception as exc:  # noqa: BLE001 - e.g. a torch without torch.cuda._sleep
        return {f"{key} error": repr(exc)[:300]}


_PROBES = {"layer_norm": _probe_layer_norm, "mlp": _probe_mlp,
           "layer_norm_bwd": _probe_backward_and_attention}


def _require(device) -> torch.device:
    reason = unavailable_reason(device)
    if reason:
        raise HostProbeUnavailable(f"host time of Level 4 cannot be measured here: {reason}. "
                                   f"The recorded breakdown is in {_shown(RECORDED)} "
                                   f"(recorded_breakdown()).")
    device = torch.device(device)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def probe(device="cuda") -> dict:
    """Every raw measurement, in the recorded file's shape: metadata, then per group
    ("layer_norm", "mlp", "layer_norm_bwd") {measurement: us}. GPU only."""
    from ..environment import describe

    dev = _require(device)
    env = describe(dev)
    res = {"command": COMMAND, "gpu": env.get("gpu"),
           "versions": f"torch {env['torch']}, triton {env['triton']}, Python {env['python']}",
           "date": env["date"][:10], "units": UNITS}
    with torch.cuda.device(dev):
        for group, fn in _PROBES.items():
            res[group] = fn(dev, lambda key: True)
    return res


# ---------------------------------------------------------------------------------------
# The breakdown: pieces that add up to one call, with what each one is
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Row:
    name: str
    what: str
    keys: tuple  # raw keys: one value, or (a, b) for a - b, or ("2x", key)
    group: str = ""  # the raw group, if not the component's own

    def value(self, raw: dict) -> float | None:
        src = raw.get(self.group) if self.group else raw.get("_own")
        src = src or {}
        if self.keys[0] == "2x":
            v = src.get(self.keys[1])
            return None if not isinstance(v, (int, float)) else round(2 * v, 2)
        vals = [src.get(k) for k in self.keys]
        if not all(isinstance(v, (int, float)) for v in vals):
            return None
        return round(vals[0] - sum(vals[1:]), 2)


@dataclass(frozen=True)
class _Layout:
    call: str
    shapes: str
    total: _Row
    eager: _Row
    pieces: tuple  # add up to total, with the remainder
    rest: str  # what the remainder is
    alternatives: tuple
    footnote: str = ""


LAYOUTS = {
    "layer_norm": _Layout(
        call="levels.triton.layer_norm(x, weight, bias) under torch.no_grad()",
        shapes=LAYER_NORM_SHAPES,
        total=_Row("the Level 4 call", "levels.triton.layer_norm: all the above",
                   ("L4 levels.triton.layer_norm no_grad",)),
        eager=_Row("eager F.layer_norm (yardstick)", "one C++ call: checks, 1 alloc, 1 launch",
                   ("eager F.layer_norm no_grad",)),
        pieces=(
            _Row("validate_layer_norm", "contract checks in Python (eager: in C++)",
                 ("validate_layer_norm",)),
            _Row("_on_kernel_device", "tensors where the kernel can read them?",
                 ("_on_kernel_device",)),
            _Row("3 allocations: y, mean, rstd", "dispatcher + caching allocator, each",
                 ("3x torch.empty",)),
            _Row("launch (triton_kernels/launch.py)", "our cache key, then the compiled launcher",
                 ("fast launch only",)),
        ),
        rest="Python glue: calls, contiguous, tiling",
        alternatives=(
            _Row("launch through kernel[grid]", "Triton's JIT binds, specializes each arg",
                 ("JIT launch only",)),
            _Row("compiled launcher alone (ck.run)", "the floor of a launch from Python",
                 ("ck.run raw",)),
            _Row("the call, direct launches off", "every launch through kernel[grid]",
                 ("L4 levels.triton.layer_norm no_grad, fast launch OFF",)),
            _Row("autograd.Function.apply", "when grad is on: node, ctx, saved tensors",
                 ("_LayerNorm.apply", "tln.layer_norm (after validation)")),
            _Row("Level 4 forward + backward", "fwd + bwd launches, autograd; eager: next",
                 ("L4 fwd+bwd",), group="layer_norm_bwd"),
            _Row("eager forward + backward", "F.layer_norm(x, w, b).backward(dy)",
                 ("eager fwd+bwd",), group="layer_norm_bwd"),
        ),
    ),
    "mlp": _Layout(
        call="levels.triton.mlp(x, w1, b1, w2, b2) under torch.no_grad()",
        shapes=MLP_SHAPES,
        total=_Row("the Level 4 call", "levels.triton.mlp: all the above", ("L4 mlp no_grad",)),
        eager=_Row("eager F.linear/gelu/linear", "3 C++ calls (cuBLAS addmm, gelu, addmm)",
                   ("eager mlp no_grad",)),
        pieces=(
            _Row("validate_mlp", "contract checks in Python (eager: in C++)",
                 ("validate_mlp",)),
            _Row("Level 4's own checks *", "device, 32-bit offsets, glue",
                 ("L4 mlp no_grad", "validate_mlp", "tmlp.mlp")),
            _Row("2 GEMMs (one timed, x 2)", "tile, key, launcher; output given",
                 ("2x", "tg.gemm gelu into out, check=False")),
        ),
        rest="2 output allocs, reshape, Python glue",
        footnote="* the Level 4 call minus validate_mlp minus triton_kernels.mlp.mlp (timed "
                 "with grad on, inputs without requires_grad: the same no-apply path)",
        alternatives=(
            _Row("one GEMM with its own checks", "gemm(check=True): operands checked again",
                 ("tg.gemm gelu into out",)),
            _Row("the call, direct launches off", "every launch through kernel[grid]",
                 ("L4 mlp no_grad, fast launch OFF",)),
            _Row("GEMM tile choice (tile_for)", "in each GEMM launch: from M, N and the SMs",
                 ("tg.tile_for",)),
        ),
    ),
}


def _shown(path: Path) -> str:
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _assemble(component: str, raw: dict, meta: dict) -> dict:
    layout = LAYOUTS[component]
    own = {"_own": raw.get(component, {}), **raw}

    def row(r: _Row) -> dict:
        # derived: a difference of two medians, so noise can make a small one negative
        derived = len(r.keys) > 1 and r.keys[0] != "2x"
        return {"name": r.name, "us": r.value(own), "what": r.what, "derived": derived}

    pieces = [row(r) for r in layout.pieces]
    total = row(layout.total)
    known = [p["us"] for p in pieces]
    rest = None
    if total["us"] is not None and all(v is not None for v in known):
        rest = round(total["us"] - sum(known), 2)
    pieces.append({"name": "the rest (call - the above)", "us": rest, "what": layout.rest,
                   "derived": True})
    errors = {k: v for k, v in raw.get(component, {}).items() if k.endswith(" error")}
    return {**meta, "component": component, "call": layout.call, "shapes": layout.shapes,
            "units": "us per call, medians, calls back to back", "total": total,
            "eager": row(layout.eager), "pieces": pieces,
            "alternatives": [row(r) for r in layout.alternatives],
            "footnote": layout.footnote,
            "kernel_us": raw.get(component, {}).get(KERNEL_KEY),
            "errors": errors, "raw": raw}


def _check_component(component: str) -> None:
    if component not in PROBED:
        raise ValueError(f"the host probe breaks down {', '.join(PROBED)}; got {component!r}")


def host_breakdown(component: str = "layer_norm", device="cuda") -> dict:
    """The host time of one small Level 4 call of `component`, measured now, piece by piece.

    Returns {"status": "measured", "gpu", "versions", "date", "call", "shapes",
    "total": {"name", "us", "what"}, "eager": {...}, "pieces": [{...}, ...] (they add up to
    total; the last is the remainder), "alternatives": [...] (not in the call),
    "kernel_us": the GPU's own time for the call, "errors": pieces that failed, "raw": the
    measurements}. Raises HostProbeUnavailable without a CUDA GPU (see unavailable_reason),
    ValueError for a component it does not cover (PROBED)."""
    _check_component(component)
    dev = _require(device)
    from ..environment import describe

    layout = LAYOUTS[component]
    rows = (layout.total, layout.eager, *layout.pieces, *layout.alternatives)
    wanted: dict[str, set] = {}
    for r in rows:
        keys = r.keys[1:] if r.keys[0] == "2x" else r.keys
        wanted.setdefault(r.group or component, set()).update(keys)
    wanted[component].add(KERNEL_KEY)
    raw = {}
    with torch.cuda.device(dev):
        for group, keys in wanted.items():
            raw[group] = _PROBES[group](dev, keys.__contains__)
    env = describe(dev)
    meta = {"status": "measured", "source": "measured here, now", "gpu": env.get("gpu"),
            "versions": f"torch {env['torch']}, triton {env['triton']}, Python {env['python']}",
            "date": env["date"][:10], "command": f"host_breakdown({component!r})", "note": None}
    return _assemble(component, raw, meta)


def load_recorded(path=None) -> dict:
    """The recorded probe (reports/h100-host-probe.json); FileNotFoundError if missing."""
    path = Path(path or RECORDED)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def recorded_breakdown(component: str = "layer_norm", path=None) -> dict:
    """host_breakdown's dict, built from the recorded JSON (status "recorded", its GPU,
    date and versions); FileNotFoundError if the file is missing."""
    _check_component(component)
    path = Path(path or RECORDED)
    raw = load_recorded(path)
    meta = {"status": "recorded", "source": _shown(path), "gpu": raw.get("gpu"),
            "versions": raw.get("versions"), "date": raw.get("date"),
            "command": raw.get("command"), "note": raw.get("note")}
    return _assemble(component, raw, meta)


def kernel_dominates_above(component: str, host_us: float) -> str | None:
    """How big the problem must be before the kernel needs longer than the host's `host_us`
    (at the H100 rate its card gives, RATES_SOURCE; an estimate: small kernels run below it)."""
    if host_us is None or host_us <= 0:
        return None
    estimate = cards.get(component).host_probe.get("kernel_dominates_above")
    return None if estimate is None else estimate(host_us, RATES_SOURCE)


__all__ = ["LAYOUTS", "PROBED", "RECORDED", "HostProbeUnavailable", "host_breakdown",
           "kernel_dominates_above", "load_recorded", "probe", "recorded_breakdown",
           "unavailable_reason"]
