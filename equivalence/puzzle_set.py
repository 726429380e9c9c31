"""The puzzles of notebooks 04a (Triton) and 05a (CUDA, in numba's dialect): small kernels, one
idea each, before the full kernels of notebooks 04 and 05. equivalence/puzzles.py runs and
checks them; this module only says what each one is.

Each puzzle gives its inputs (tiny, drawn fresh), the answer in NumPy (float64), how the
kernel is launched (so its signature is fixed: the student writes the body), which input
elements the answer needs (the "expected reads" of the picture) and a hint. The sizes are
chosen so that the last block always runs past the edge: every puzzle is also a masking
puzzle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@dataclass(frozen=True)
class Puzzle:
    name: str
    engine: str  # "triton" (notebook 04a) or "numba" (05a)
    task: str  # what the kernel computes, in symbols
    signature: str  # the kernel's parameters, as `launch` passes them, and its grid
    hint: str
    make: Callable  # make(rng) -> ({input: array}, {size: int}); the output is allocated
    # with the answer's shape, NaN-filled, and added under `out` before the launch
    answer: Callable  # answer(arrays, sizes) -> float64 array of the output
    launch: Callable  # launch(kernel, arrays, sizes): the grid, the block, the arguments
    out: str = "y"
    reads: Callable | None = None  # reads(arrays, sizes) -> {input: bool mask}; None: all
    barrier: bool = False  # must call cuda.syncthreads() (a race can pass by luck)
    rtol: float = 1e-5


def _randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _lengths(rng, rows, cols):
    return rng.integers(1, cols + 1, size=rows).astype(np.int32)


def _masked_softmax(a, s):
    x = a["x"].astype(np.float64)
    valid = np.arange(x.shape[1])[None, :] < a["lengths"][:, None]
    z = np.where(valid, x, -np.inf)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return np.where(valid, e / e.sum(axis=1, keepdims=True), 0.0)


def _softmax_reads(a, s):
    cols = np.arange(a["x"].shape[1])[None, :]
    return {"x": cols < a["lengths"][:, None], "lengths": np.ones(a["lengths"].shape, bool)}


# ---------------------------------------------------------------------------------------
# Triton (notebook 04a): one program per block of work, tl.arange lanes, masks
# ---------------------------------------------------------------------------------------

def _triton_grid(*dims):
    return tuple(dims)


TRITON = [
    Puzzle(
        "map", "triton", "y[i] = x[i] + 10, for i < N (N = 200)",
        "map_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr), grid (cdiv(N, BLOCK),), BLOCK = 64",
        "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) are this program's elements; "
        "the last program runs past N, so load and store with mask=offs < N",
        lambda rng: ({"x": _randn(rng, 200)}, {"N": 200}),
        lambda a, s: a["x"].astype(np.float64) + 10,
        lambda k, a, s: k[_triton_grid(cdiv(s["N"], 64))](a["x"], a["y"], s["N"], BLOCK=64)),
    Puzzle(
        "outer", "triton", "z[i, j] = a[i] + b[j]: a (R = 20), b (C = 30), z (R, C) row-major",
        "outer_kernel(a_ptr, b_ptr, z_ptr, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr), "
        "grid (1,), BLOCK_R = BLOCK_C = 32",
        "rows = tl.arange(0, BLOCK_R)[:, None] and cols = tl.arange(0, BLOCK_C)[None, :] "
        "broadcast to a BLOCK_R x BLOCK_C tile; z[i, j] is at z_ptr + i * C + j; the tile is "
        "larger than z on both edges: mask (rows < R) & (cols < C)",
        lambda rng: ({"a": _randn(rng, 20), "b": _randn(rng, 30)}, {"R": 20, "C": 30}),
        lambda a, s: a["a"].astype(np.float64)[:, None] + a["b"].astype(np.float64)[None, :],
        lambda k, a, s: k[_triton_grid(1)](a["a"], a["b"], a["z"], s["R"], s["C"], BLOCK_R=32,
                                           BLOCK_C=32),
        out="z"),
    Puzzle(
        "row_sum", "triton", "y[i] = sum over j of x[i, j]: x (R = 6, C = 50) row-major",
        "row_sum_kernel(x_ptr, y_ptr, C, BLOCK_C: tl.constexpr), grid (R,): program i owns "
        "row i, BLOCK_C = 64",
        "load row i (x_ptr + i * C + cols) masked with other=0.0, so the lanes past C add "
        "nothing; tl.sum(row, axis=0) is one number: store it at y_ptr + i",
        lambda rng: ({"x": _randn(rng, 6, 50)}, {"R": 6, "C": 50}),
        lambda a, s: a["x"].astype(np.float64).sum(axis=1),
        lambda k, a, s: k[_triton_grid(s["R"])](a["x"], a["y"], s["C"], BLOCK_C=64)),
    Puzzle(
        "matmul", "triton", "c = a @ b: a (M = 20, K = 40), b (K, N = 24), c (M, N), row-major",
        "matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: "
        "tl.constexpr, BLOCK_K: tl.constexpr), grid (cdiv(M, 16), cdiv(N, 16)), all blocks 16",
        "program (pm, pn) owns c's tile rows pm*BLOCK_M + arange, columns pn*BLOCK_N + arange; "
        "for k0 in range(0, K, BLOCK_K): load the a tile (rows x k0 + arange(BLOCK_K)) and the "
        "b tile, both masked with other=0.0 (a zero adds nothing to a dot), acc += "
        "tl.dot(a_tile, b_tile); store acc masked on both edges",
        lambda rng: ({"a": _randn(rng, 20, 40), "b": _randn(rng, 40, 24)},
                     {"M": 20, "N": 24, "K": 40}),
        lambda a, s: a["a"].astype(np.float64) @ a["b"].astype(np.float64),
        lambda k, a, s: k[_triton_grid(cdiv(s["M"], 16), cdiv(s["N"], 16))](
            a["a"], a["b"], a["c"], s["M"], s["N"], s["K"], BLOCK_M=16, BLOCK_N=16, BLOCK_K=16),
        out="c", rtol=5e-3),  # on a GPU tl.dot may use TF32 (10-bit mantissas)
    Puzzle(
        "masked_softmax", "triton",
        "y[i, j] = softmax of x[i, :L[i]] at j for j < L[i], and 0 for L[i] <= j < C: x, y "
        "(R = 5, C = 40) row-major, L = lengths (R,), int32, 1 <= L[i] <= C",
        "masked_softmax_kernel(x_ptr, len_ptr, y_ptr, C, BLOCK_C: tl.constexpr), grid (R,), "
        "BLOCK_C = 64",
        "n = tl.load(len_ptr + i); load x's row with mask cols < n and other=-inf (exp(-inf) "
        "= 0: the masked lanes drop out of the sum); subtract the row's max before tl.exp; "
        "store over cols < C, tl.where(cols < n, p, 0.0). The elements past L[i] are never "
        "needed: the picture shows them unread",
        lambda rng: ({"x": _randn(rng, 5, 40), "lengths": _lengths(rng, 5, 40)},
                     {"R": 5, "C": 40}),
        _masked_softmax,
        lambda k, a, s: k[_triton_grid(s["R"])](a["x"], a["lengths"], a["y"], s["C"], BLOCK_C=64),
        reads=_softmax_reads),
]


# ---------------------------------------------------------------------------------------
# CUDA in numba's dialect (notebook 05a): one thread per element, blocks, shared memory
# ---------------------------------------------------------------------------------------

NUMBA = [
    Puzzle(
        "map", "numba", "y[i] = x[i] + 10, for i < n (n = 200)",
        "map_kernel(x, y, n), launched [cdiv(n, 32), 32]: 7 blocks of 32 threads",
        "i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x (or cuda.grid(1)); the last "
        "block has threads past n: guard with `if i < n:`",
        lambda rng: ({"x": _randn(rng, 200)}, {"n": 200}),
        lambda a, s: a["x"].astype(np.float64) + 10,
        lambda k, a, s: k[cdiv(s["n"], 32), 32](a["x"], a["y"], s["n"])),
    Puzzle(
        "outer", "numba", "z[i, j] = a[i] + b[j]: a (R = 20), b (C = 30), z (R, C)",
        "outer_kernel(a, b, z), launched [(cdiv(C, 8), cdiv(R, 8)), (8, 8)]: x across "
        "columns, y down rows",
        "row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, col likewise with .x; "
        "both edges run over: `if row < z.shape[0] and col < z.shape[1]:`",
        lambda rng: ({"a": _randn(rng, 20), "b": _randn(rng, 30)}, {"R": 20, "C": 30}),
        lambda a, s: a["a"].astype(np.float64)[:, None] + a["b"].astype(np.float64)[None, :],
        lambda k, a, s: k[(cdiv(s["C"], 8), cdiv(s["R"], 8)), (8, 8)](a["a"], a["b"], a["z"]),
        out="z"),
    Puzzle(
        "row_sum", "numba", "y[i] = sum over j of x[i, j]: x (R = 6, C = 50)",
        "row_sum_kernel(x, y), launched [1, 32]: one thread per row (threads past R idle)",
        "thread i < x.shape[0] walks its row with a loop, a float accumulator in a register, "
        "and writes y[i] once at the end",
        lambda rng: ({"x": _randn(rng, 6, 50)}, {"R": 6, "C": 50}),
        lambda a, s: a["x"].astype(np.float64).sum(axis=1),
        lambda k, a, s: k[1, 32](a["x"], a["y"])),
    Puzzle(
        "matmul", "numba", "c = a @ b: a (M = 16, K = 24), b (K, N = 16), c (M, N)",
        "matmul_kernel(a, b, c), launched [(cdiv(N, TILE), cdiv(M, TILE)), (TILE, TILE)], "
        "TILE = 8: a thread per element of c, a TILE x TILE tile of a and of b staged in "
        "shared memory per step of k",
        "sa = cuda.shared.array((TILE, TILE), float32) (and sb); for each k0 in range(0, K, "
        "TILE): each thread copies one element of each tile (0.0 past an edge), "
        "cuda.syncthreads() (the tile is complete), TILE multiply-adds from shared memory, "
        "cuda.syncthreads() again (nobody overwrites a tile still being read); then write c",
        lambda rng: ({"a": _randn(rng, 16, 24), "b": _randn(rng, 24, 16)},
                     {"M": 16, "N": 16, "K": 24}),
        lambda a, s: a["a"].astype(np.float64) @ a["b"].astype(np.float64),
        lambda k, a, s: k[(cdiv(s["N"], 8), cdiv(s["M"], 8)), (8, 8)](a["a"], a["b"], a["c"]),
        out="c", barrier=True, rtol=1e-4),
    Puzzle(
        "masked_softmax", "numba",
        "y[i, j] = softmax of x[i, :L[i]] at j for j < L[i], and 0 for L[i] <= j < C: x, y "
        "(R = 5, C = 40), L = lengths (R,), 1 <= L[i] <= C",
        "masked_softmax_kernel(x, lengths, y), launched [1, 32]: one thread per row",
        "three walks over the first L[i] elements of row i: the max, the sum of math.exp(x - "
        "max), then y = exp(x - max) / sum; and zeros from L[i] to the end of the row. Reading "
        "past L[i] is never needed",
        lambda rng: ({"x": _randn(rng, 5, 40), "lengths": _lengths(rng, 5, 40)},
                     {"R": 5, "C": 40}),
        _masked_softmax,
        lambda k, a, s: k[1, 32](a["x"], a["lengths"], a["y"]),
        reads=_softmax_reads),
    Puzzle(
        "block_sum", "numba",
        "y[b] = sum of x[64 b : 64 b + 64] (n = 250: the last block is short), y (4,)",
        "block_sum_kernel(x, y, n), launched [4, 64]: block b sums its 64 elements, THREADS = 64",
        "s = cuda.shared.array(THREADS, float32); thread t stages x[i] (0.0 past n); "
        "cuda.syncthreads(); then stride = THREADS // 2, ..., 1: `if t < stride: s[t] += "
        "s[t + stride]` and cuda.syncthreads() after each step, outside the `if` (every thread "
        "of the block must reach a barrier); thread 0 writes y[b] = s[0]",
        lambda rng: ({"x": _randn(rng, 250)}, {"n": 250}),
        lambda a, s: np.array([a["x"][64 * b:64 * b + 64].astype(np.float64).sum()
                               for b in range(4)]),
        lambda k, a, s: k[4, 64](a["x"], a["y"], s["n"]), barrier=True, rtol=1e-5),
]

def get(engine: str, name: str) -> Puzzle:
    """The puzzle `name` of `engine` ("triton" or "numba"); a ValueError naming the choices."""
    found = {p.name: p for p in (TRITON if engine == "triton" else NUMBA if engine == "numba"
                                 else [])}
    if engine not in ("triton", "numba"):
        raise ValueError(f"argument 'engine' must be 'triton' or 'numba'; got {engine!r}")
    if name not in found:
        raise ValueError(f"argument 'name' must be one of the {engine} puzzles "
                         f"({', '.join(found)}); got {name!r}")
    return found[name]
