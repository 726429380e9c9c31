"""Puzzle warm-ups (notebooks 04a and 05a): run a student's small kernel on a CPU, check its
answer, and when it is wrong, draw which elements it read and wrote next to the elements the
answer needs.

    from equivalence import puzzles
    puzzles.describe("triton", "map")        # the task, the signature, the launch
    puzzles.check("triton", "map", map_kernel)   # PuzzleResult; PuzzleFailed (an
                                             # AssertionError) with the picture when wrong

How the accesses are seen. Triton runs in its interpreter (TRITON_INTERPRET=1, what `import
levels` sets without a GPU), whose loads and stores equivalence/interpreter.py already
watches for out-of-bounds checks: `interpreter.watching` hands every load's and store's byte
addresses here, and they are turned into element offsets of the tensors the puzzle handed
out. Each tensor sits in the middle of an allocation one row (a 1-D tensor: its own length)
larger on each side (an output's margins NaN, an input's a large number), so an access just
past an edge (`offs <= N`) lands in that margin, is drawn there, and fails the check instead
of corrupting the heap; anything farther is the interpreter's OutOfBounds, with its message. The numba puzzles run in numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1): the arrays handed to the kernel are simulator arrays
whose indexing records the element (and the thread) of every read and write; an index
outside the array is recorded and refused (a read gives NaN), where a GPU would silently
touch another allocation's memory. `cuda.syncthreads()` calls are counted: a missing
barrier can give the right answer by luck in the simulator, never on purpose.

Without the interpreter or the simulator (a GPU) the kernel runs compiled: the answer is
still checked, and a Triton store into the output's margins is still found (they held NaN),
but the accesses are not seen: a failure says so instead of drawing.

The answer is compared with the puzzle's float64 answer by relative error (`rtol`); the
failure message leads with the first problem: an access outside a tensor, an element never
written (still NaN), the first wrong element (index, got, expected: the task is stated in
the open, so the expected number gives nothing away), a missing barrier. Then the hint.
"""

from __future__ import annotations

import contextlib
import textwrap
import threading
from dataclasses import dataclass, field

import numpy as np

from . import interpreter
from .puzzle_set import NUMBA, TRITON, Puzzle, get

__all__ = ["PuzzleFailed", "PuzzleResult", "check", "describe", "get", "TRITON", "NUMBA"]


class PuzzleFailed(AssertionError):
    """A puzzle's kernel gave a wrong answer or touched what it must not (the message says
    what first, then the hint); `.result` holds the accesses and the figure."""

    def __init__(self, result: "PuzzleResult"):
        super().__init__(result.message)
        self.result = result


@dataclass
class Accesses:
    """Element offsets a kernel touched in one tensor, margins included: counts[k + margin]
    for offset k in [-margin, numel + margin)."""
    shape: tuple
    margin: int
    reads: np.ndarray = None
    writes: np.ndarray = None
    far: dict = field(default_factory=lambda: {"load": 0, "store": 0})  # beyond the margins
    first_outside: str = ""  # the first access outside the tensor, said

    def __post_init__(self):
        n = int(np.prod(self.shape)) + 2 * self.margin
        self.reads = np.zeros(n, dtype=bool)
        self.writes = np.zeros(n, dtype=bool)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))

    def add(self, kind: str, offsets, who: str = "") -> None:
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
        inside = (offsets >= -self.margin) & (offsets < self.numel + self.margin)
        self.far[kind] += int((~inside).sum())
        (self.reads if kind == "load" else self.writes)[offsets[inside] + self.margin] = True
        outside = offsets[(offsets < 0) | (offsets >= self.numel)]
        if outside.size and not self.first_outside:
            self.first_outside = (f"{'a read of' if kind == 'load' else 'a write to'} element "
                                  f"offset {int(outside[0])}{who}")

    def outside(self, kind: str) -> int:
        mask = self.reads if kind == "load" else self.writes
        m = self.margin
        return int(mask[:m].sum() + mask[m + self.numel:].sum())


@dataclass
class PuzzleResult:
    puzzle: Puzzle
    passed: bool
    message: str
    accesses: dict = field(default_factory=dict)  # tensor name -> Accesses (empty: not seen)
    figure: object = None


def describe(engine: str, name: str) -> str:
    """The puzzle's task, its kernel's signature and launch, as the notebook shows them."""
    p = get(engine, name)
    return f"{engine} puzzle {name!r}: {p.task}\n  write: {p.signature}"


def check(engine: str, name: str, kernel, seed: int | None = None, draw: bool = True,
          raise_on_failure: bool = True) -> PuzzleResult:
    """Run `kernel` on the puzzle's fresh inputs and check it (see the module doc). A wrong
    kernel raises PuzzleFailed, after drawing its accesses (draw=False: not drawn)."""
    puzzle = get(engine, name)
    rng = np.random.default_rng(seed)
    arrays, sizes = puzzle.make(rng)
    expected = np.asarray(puzzle.answer(arrays, sizes), dtype=np.float64)
    run = _run_triton if engine == "triton" else _run_numba
    got, accesses, error, barriers = run(puzzle, kernel, arrays, sizes, expected.shape)
    problem = error or _problem(puzzle, got, expected, accesses, barriers)
    if problem is None:
        size = ", ".join(f"{k}: {v.numel}" for k, v in accesses.items()) if accesses else ""
        return PuzzleResult(puzzle, True, f"{engine} puzzle {name!r}: correct"
                            + (f" (elements per tensor: {size})" if size else ""), accesses)
    message = f"{engine} puzzle {name!r}: {problem}\nHint: {puzzle.hint}."
    if not accesses:
        message += ("\n(The kernel ran compiled: which elements it read and wrote can only be "
                    "seen under Triton's interpreter or numba's simulator.)")
    result = PuzzleResult(puzzle, False, message, accesses)
    if draw and accesses:
        result.figure = picture(puzzle, arrays, sizes, accesses, problem)
    if raise_on_failure:
        raise PuzzleFailed(result)
    return result


_EDGE = {"triton": "The lanes past the edge must be masked off (`mask=offs < N`, not "
                   "`offs <= N`), on the loads and the stores",
         "numba": "The threads past the edge must do nothing (`if i < n:`, not `i <= n`)"}


def _problem(puzzle: Puzzle, got, expected, accesses: dict, barriers: int | None) -> str | None:
    out = puzzle.out
    for kind in ("store", "load"):
        for tensor, acc in accesses.items():
            n = acc.outside(kind) + acc.far[kind]
            if n:
                return (f"{n} {'write' if kind == 'store' else 'read'}(s) outside {tensor} "
                        f"({acc.numel} elements, shape {acc.shape}); the first: "
                        f"{acc.first_outside}. {_EDGE[puzzle.engine]}")
    unwritten = np.isnan(got)
    if unwritten.any():
        first = _index(np.argwhere(unwritten)[0])
        return (f"{int(unwritten.sum())} of {got.size} elements of {out} were never written "
                f"(still NaN); the first: {out}{first}")
    err = np.abs(got - expected) / np.maximum(np.abs(expected), 1.0)
    wrong = ~(err <= puzzle.rtol)
    if wrong.any():
        at = tuple(np.argwhere(wrong)[0])
        return (f"{int(wrong.sum())} of {got.size} elements of {out} are wrong; the first, "
                f"{out}{_index(at)}: got {got[at]:.6g}, expected {expected[at]:.6g}")
    if puzzle.barrier and barriers == 0:
        return ("the answer is right, but the kernel never calls cuda.syncthreads(), and this "
                "puzzle is the barrier's: without one, a thread reads shared memory that other "
                "threads of its block may not have written yet. The simulator may run them in "
                "order; a GPU does not")
    return None


def _index(at) -> str:
    return "[" + ", ".join(str(int(i)) for i in at) + "]"


# ---------------------------------------------------------------------------------------
# Triton: tensors in NaN margins, accesses from the interpreter's watch
# ---------------------------------------------------------------------------------------

def _margin(shape: tuple) -> int:
    return int(shape[-1]) if shape else 1  # a row (a 1-D tensor: its length)


_INPUT_MARGIN = 1.0e6  # an input's margins: a read of them makes a number no answer has


def _padded(array: np.ndarray, device, fill=float("nan")):
    """A torch tensor with `array`'s values in the middle of an allocation one margin larger
    on each side, filled with `fill` (0 for integers). An output's margins hold NaN, so a
    store there is seen even where the accesses are not (compiled, on a GPU); an input's hold
    a large number, so that what a read of them gives flows into a store there, or into a
    wrong value."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(array))
    m = _margin(t.shape)
    fill = fill if t.dtype.is_floating_point else 0
    store = torch.full((t.numel() + 2 * m,), fill, dtype=t.dtype, device=device)
    view = store[m:m + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def _run_triton(puzzle, kernel, arrays, sizes, out_shape):
    import torch

    device = "cpu" if interpreter.active() else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the Triton puzzles need a GPU or Triton's CPU interpreter: import "
                           "levels before triton (without a GPU it sets TRITON_INTERPRET=1), or "
                           "start Python with TRITON_INTERPRET=1")
    tensors = {k: _padded(v, device, _INPUT_MARGIN) for k, v in arrays.items()}
    tensors[puzzle.out] = _padded(np.full(out_shape, np.nan, dtype=np.float32), device)
    watched = interpreter.active()
    accesses = {k: Accesses(tuple(t.shape), _margin(t.shape)) for k, t in tensors.items()} \
        if watched else {}
    lock = threading.Lock()

    def seen(kind, addresses, itemsize):
        with lock:
            for name, t in tensors.items():
                base = t.data_ptr()
                offsets = (addresses.astype(np.int64) - base) // t.element_size()
                m = accesses[name].margin
                near = (offsets >= -m) & (offsets < t.numel() + m)
                if near.any():
                    accesses[name].add(kind, offsets[near])

    error = None
    with interpreter.watching(seen) if watched else contextlib.nullcontext():
        try:
            puzzle.launch(kernel, tensors, sizes)
        except interpreter.OutOfBounds as e:
            error = str(e)
        except Exception as e:  # noqa: BLE001 - the student's kernel: said, with the hint
            error = _raised(e)
    if device == "cuda":
        torch.cuda.synchronize()
    out = tensors[puzzle.out]
    if not watched and error is None:
        # Compiled, the accesses are not seen; stores into the output's margins still leave
        # a trace (they held NaN).
        hit = _margin_writes(out)
        if hit:
            error = (f"{hit} write(s) outside {puzzle.out} (seen in the margins around it after "
                     f"the run). {_EDGE[puzzle.engine]}")
    got = out.detach().cpu().double().numpy()
    return got, accesses, error, None


def _margin_writes(out) -> int:
    """How many elements of the NaN margins around `out` (a _padded tensor) hold a number."""
    import torch

    m, n = _margin(out.shape), out.numel()
    store = torch.empty(0, dtype=out.dtype, device=out.device).set_(out.untyped_storage())
    return int((~torch.isnan(store[:m])).sum() + (~torch.isnan(store[m + n:])).sum())


# ---------------------------------------------------------------------------------------
# numba: simulator arrays that record each index
# ---------------------------------------------------------------------------------------

_SYNC = {"count": 0}
_SYNC_LOCK = threading.Lock()
_SYNC_PATCHED = False


def _count_barriers() -> None:
    """Count cuda.syncthreads() of simulated threads (once per process)."""
    global _SYNC_PATCHED
    with _SYNC_LOCK:
        if _SYNC_PATCHED:
            return
        from numba.cuda.simulator.kernel import BlockThread

        original = BlockThread.syncthreads

        def syncthreads(self, *args, **kwargs):
            with _SYNC_LOCK:
                _SYNC["count"] += 1
            return original(self, *args, **kwargs)

        BlockThread.syncthreads = syncthreads
        _SYNC_PATCHED = True


def _traced_class():
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    class Traced(FakeCUDAArray):
        """A simulator array that records the flat offset of every element read and written,
        and refuses (records) an index outside itself."""

        def _offsets(self, idx):
            shape = self._ary.shape
            key = idx if isinstance(idx, tuple) else (idx,)
            if all(isinstance(i, (int, np.integer)) for i in key) and len(key) == len(shape):
                flat = 0
                for i, n in zip(key, shape):
                    flat = flat * n + int(i)  # as a GPU computes the address: no wrap-around
                inside = all(0 <= int(i) < n for i, n in zip(key, shape))
                return np.array([flat]), inside
            return np.arange(self._ary.size).reshape(shape)[idx].reshape(-1), True

        def _record(self, kind, idx):
            offsets, inside = self._offsets(idx)
            me = threading.current_thread()
            who = f" (index {_index(idx if isinstance(idx, tuple) else (idx,))}"
            if hasattr(me, "threadIdx"):
                who += f", thread {tuple(me.threadIdx)} of block {tuple(me.blockIdx)}"
            who += ")"
            with _SYNC_LOCK:
                self.levels_accesses.add(kind, offsets, who)
            return inside

        def __getitem__(self, idx):
            if not self._record("load", idx):
                return np.float32("nan")
            return super().__getitem__(idx)

        def __setitem__(self, idx, value):
            if self._record("store", idx):
                super().__setitem__(idx, value)

    return Traced


def _run_numba(puzzle, kernel, arrays, sizes, out_shape):
    import numba_kernels

    import torch

    why = numba_kernels.unavailable_reason("cpu" if numba_kernels.SIMULATED
                                           or not torch.cuda.is_available() else "cuda")
    if why:
        raise RuntimeError(f"the numba puzzles cannot run here: {why}")
    host = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    host[puzzle.out] = np.full(out_shape, np.nan, dtype=np.float32)
    accesses, error = {}, None
    if numba_kernels.SIMULATED:
        _count_barriers()
        traced = _traced_class()
        args = {}
        for name, a in host.items():
            t = traced(a)
            t.levels_accesses = accesses[name] = Accesses(a.shape, _margin(a.shape))
            args[name] = t
    else:
        args = host
    before = _SYNC["count"]
    try:
        puzzle.launch(kernel, args, sizes)
    except Exception as e:  # noqa: BLE001 - the student's kernel: said, with the hint
        error = _raised(e)
    barriers = _SYNC["count"] - before if numba_kernels.SIMULATED else None
    return host[puzzle.out].astype(np.float64), accesses, error, barriers


def _raised(e: Exception) -> str:
    """What a kernel's exception says to its author (the interpreter and the simulator wrap
    what the kernel raised: a blank exercise's stub is named as such)."""
    text = str(e).strip()
    if isinstance(e, NotImplementedError) or "NotImplementedError" in text:
        return "the kernel is not written yet (its body still raises NotImplementedError)"
    return f"the kernel raised {type(e).__name__}: {_simulator_words(text)[:1500]}"


def _simulator_words(text: str) -> str:
    """The simulator's errors, said as CUDA would (a kernel that names cuda.blockDim where
    the simulator has no such attribute outside a kernel, ...)."""
    text = text.strip()
    if "has no attribute" in text and "numba.cuda" in text:
        text += (" (under the simulator, cuda.threadIdx, cuda.blockIdx, cuda.blockDim and "
                 "cuda.syncthreads exist only inside a running kernel: call them in the "
                 "kernel's body, not at import or from a helper called outside it)")
    return text


# ---------------------------------------------------------------------------------------
# The picture
# ---------------------------------------------------------------------------------------

_READ, _WRITTEN, _OUTSIDE, _MARGIN = 1, 2, 4, 5  # 0: untouched, 3: read and written


def _grid(acc: Accesses, reads, writes) -> np.ndarray:
    """reads/writes (over margins + tensor) as a 2-D image of codes: one margin row above and
    below the tensor's rows (a 1-D tensor is one row); a touched margin cell is _OUTSIDE."""
    cols = acc.shape[-1] if acc.shape else 1
    codes = reads.astype(int) * _READ + writes.astype(int) * _WRITTEN
    margin = np.ones(codes.shape, dtype=bool)
    margin[acc.margin:acc.margin + acc.numel] = False
    codes[margin] = np.where(codes[margin] > 0, _OUTSIDE, _MARGIN)
    return codes.reshape(-1, cols)


def picture(puzzle: Puzzle, arrays: dict, sizes: dict, accesses: dict, problem: str):
    """A figure: one column per tensor, the elements the answer needs (top) against those
    the kernel touched (bottom), with the margins around each tensor; titled by the problem."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    needed = puzzle.reads(arrays, sizes) if puzzle.reads else {}
    names = list(accesses)
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names) + 1, 4.6), squeeze=False)
    colors = ListedColormap(["#eeeeee", "#4c78a8", "#f58518", "#9d4edd", "#d62728", "#fbe3e3"])
    for j, name in enumerate(names):
        acc = accesses[name]
        m, n = acc.margin, acc.numel
        want_r = np.zeros_like(acc.reads)
        want_w = np.zeros_like(acc.writes)
        if name == puzzle.out:
            want_w[m:m + n] = True
        else:
            want_r[m:m + n] = np.asarray(needed.get(name, np.ones(acc.shape, bool))).reshape(-1)
        for i, (r, w, label) in enumerate(((want_r, want_w, "expected"),
                                           (acc.reads, acc.writes, "your kernel"))):
            ax = axes[i][j]
            image = _grid(acc, r, w)
            ax.imshow(image, cmap=colors, vmin=0, vmax=5, aspect="auto", interpolation="nearest")
            ys, xs = np.nonzero(image == _OUTSIDE)  # one cell of 200 would not show: circled
            ax.scatter(xs, ys, s=60, facecolors="none", edgecolors="#d62728", linewidths=1.5)
            rows = image.shape[0]
            ax.set_title(f"{name} {tuple(acc.shape)}: {label}", fontsize=9)
            ax.set_xlabel("column (last index)" if len(acc.shape) > 1 else "element")
            ax.set_ylabel("row" if len(acc.shape) > 1 else "")
            ticks = [0, rows - 1] + ([1, rows - 2] if rows > 3 else [])
            labels = ["before", "after"] + (["0", str(rows - 3)] if rows > 3 else [])
            ax.set_yticks(ticks, labels, fontsize=7)
    fig.legend(handles=[Patch(color=colors(k), label=t) for k, t in
                        ((1, "read"), (2, "written"), (3, "read and written"),
                         (5, "outside the tensor"), (4, "touched outside"))],
               loc="lower center", ncol=5, fontsize=8)
    fig.suptitle("\n".join(textwrap.wrap(problem.split(". ")[0], 110)), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 0.93))
    return fig
