"""Timing one callable, the same way for every level.

Rules (the reasons are the lesson):
- The first call is timed on its own, wall clock, synchronized: it contains compilation
  (torch.compile, Triton JIT, nvcc) and allocator warm-up, which steady state must not.
- Then warm-up calls, then many timed calls; we report the median (robust to the odd
  context switch) and the 20th/80th percentiles as the spread.
- GPU: CUDA events around each call, and the L2 cache flushed before each one (as
  triton.testing.do_bench does), so a 50 MB tensor is not "read" from a 50 MB cache.
  Events time the GPU's queue, so if Python enqueues a call more slowly than the GPU runs
  it (autograd + several launches around a 0.2 ms kernel), the figure is the CPU's pace,
  not the kernels': what a user feels, and the default. `prime=True` asks for kernel time
  instead: a GPU-side sleep (torch.cuda._sleep) holds the queue while Python enqueues a
  batch of calls, so no call waits for the CPU. Bandwidth goals use it, on both sides.
- CPU: torch.utils.benchmark.Timer, which handles threads and picks the repeat count.
- Host time (`time_host`): calls back to back, one synchronize per batch, wall clock. On a
  problem too small to keep the device busy, that is what a call costs the CPU (Python,
  validation, dispatch, autograd, launches): the floor under every time above.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    runs: int
    method: str
    cpu_enqueue_ms: float | None = None  # GPU: CPU time to enqueue one call (+ the L2 flush)

    def to_dict(self) -> dict:
        return asdict(self)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_first_call(fn, device: torch.device) -> float:
    """Milliseconds of one synchronized call (use it on the very first call)."""
    device = torch.device(device)
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    pos = q * (len(values) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


_L2_FLUSH: dict = {}


_BATCH = 10
_CYCLES_PER_S = 2.0e9  # above any SM clock we run on: a slower clock only sleeps longer


def _time_cuda(fn, device: torch.device, min_time_s: float, warmup: int, max_runs: int,
               prime: bool) -> Timing:
    flush = _L2_FLUSH.setdefault(device, torch.empty(256 * 2 ** 20, dtype=torch.int8, device=device))
    sleep = getattr(torch.cuda, "_sleep", None)
    if prime and sleep is None:
        raise RuntimeError("time_fn(prime=True) needs torch.cuda._sleep, which this torch lacks")
    enqueue_s = []
    for _ in range(warmup):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        flush.zero_()
        fn()
        enqueue_s.append(time.perf_counter() - t0)  # CPU time to enqueue, GPU still busy
    torch.cuda.synchronize(device)
    # Sleep for twice the CPU time a batch takes to enqueue (plus 50 us per call for the
    # events), so the GPU is still asleep when the batch's last call is in the queue.
    cycles = int(2 * _BATCH * (min(enqueue_s) + 50e-6) * _CYCLES_PER_S)
    times: list[float] = []
    budget_end = time.perf_counter() + min_time_s
    while len(times) < max_runs and (len(times) < 10 or time.perf_counter() < budget_end):
        if prime:
            sleep(cycles)
        batch = []
        for _ in range(_BATCH):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            batch.append((start, end))
        torch.cuda.synchronize(device)
        times += [s.elapsed_time(e) for s, e in batch]
    return Timing(statistics.median(times), quantile(times, 0.2), quantile(times, 0.8), len(times),
                  "cuda-events, L2 flushed" + (", queue primed (kernel time)" if prime else ""),
                  cpu_enqueue_ms=min(enqueue_s) * 1e3)


def _time_cpu(fn, min_time_s: float, warmup: int) -> Timing:
    from torch.utils import benchmark

    for _ in range(warmup):
        fn()
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_time_s)
    per_call = [t * 1e3 for t in m.times]  # each entry is already a per-call mean of one block
    return Timing(m.median * 1e3, quantile(per_call, 0.2), quantile(per_call, 0.8),
                  m.number_per_run * len(m.times), "torch.utils.benchmark")


def time_fn(fn, device, min_time_s: float = 0.3, warmup: int = 3, max_runs: int = 1000,
            prime: bool = False) -> Timing:
    """Steady-state timing of `fn()` (call `time_first_call` before it for the cold start).
    prime=True (GPU only): kernel time, without the CPU's enqueue time; see the module doc."""
    device = torch.device(device)
    if device.type == "cuda":
        return _time_cuda(fn, device, min_time_s, warmup, max_runs, prime)
    return _time_cpu(fn, min_time_s, warmup)


def time_host(fn, device, min_time_s: float = 0.2, warmup: int = 3, batch: int = 20) -> Timing:
    """Wall-clock milliseconds per call of `fn()` run back to back (see the module doc).
    Only the end of each batch is synchronized, so a GPU that finishes each call before
    the CPU has issued the next one adds nothing: use it on a tiny problem."""
    device = torch.device(device)
    if device.type != "cuda":
        # on a CPU the call *is* the host's work: time it as the steady state is timed (same
        # Timer, same thread count), or the two could not be compared
        t = _time_cpu(fn, min_time_s, warmup)
        t.method += " (on a CPU, host time is the whole call)"
        return t
    for _ in range(warmup):
        fn()
    synchronize(device)
    per_call: list[float] = []
    budget_end = time.perf_counter() + min_time_s
    while len(per_call) < 5 or time.perf_counter() < budget_end:
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        synchronize(device)
        per_call.append((time.perf_counter() - start) * 1e3 / batch)
    return Timing(statistics.median(per_call), quantile(per_call, 0.2), quantile(per_call, 0.8),
                  batch * len(per_call), "wall clock, calls back to back")


def peak_memory_mb(fn, device) -> float | None:
    """Extra GPU memory one call needs at its peak, above what was allocated before it."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2 ** 20


def settled(goal: float, p20, p80) -> bool | None:
    """Whether a measurement's p20 .. p80 lie on one side of `goal` (None without them): where
    they straddle it, one run does not decide the goal. Host times near a goal flip between
    lent machines (reports/conv-bn-layout-and-suite/: tens of µs at some rows)."""
    return None if p20 is None or p80 is None else not (p20 <= goal <= p80)
