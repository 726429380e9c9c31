"""The puzzle warm-ups (notebooks 04a and 05a, equivalence/puzzles.py): a right kernel passes,
and each kind of wrong one fails with the message and the picture a student needs. The
notebooks themselves run their reference answers in CI (--nbmake)."""

import json

import numba_kernels  # noqa: F401 - first: the simulator switches on before numba loads
import numpy as np
import pytest
import triton
import triton.language as tl
from numba import cuda

from equivalence import puzzles
from equivalence.settings import REPOSITORY as ROOT


@triton.jit
def _map_off_by_one(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i <= N) + 10, mask=i <= N)


@triton.jit
def _map_skips_the_last_program(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if tl.program_id(0) < tl.num_programs(0) - 1:
        tl.store(y_ptr + i, tl.load(x_ptr + i) + 10)


@triton.jit
def _row_sum_of_row_zero(x_ptr, y_ptr, C, BLOCK_C: tl.constexpr):
    cols = tl.arange(0, BLOCK_C)
    tl.store(y_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + cols, mask=cols < C, other=0.0)))


def _failure(engine, name, kernel):
    with pytest.raises(puzzles.PuzzleFailed) as info:
        puzzles.check(engine, name, kernel, seed=0)
    return info.value


def test_a_store_past_the_edge_is_seen_said_and_drawn():
    failed = _failure("triton", "map", _map_off_by_one)
    message = str(failed)
    assert message.startswith("triton puzzle 'map': 1 write(s) outside y (200 elements, shape "
                              "(200,)); the first: a write to element offset 200."), message
    assert "`mask=offs < N`, not `offs <= N`" in message and "\nHint: " in message
    y = failed.result.accesses["y"]
    assert y.writes[y.margin:y.margin + 200].all() and y.outside("store") == 1
    figure = failed.result.figure
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["x (200,): expected", "y (200,): expected", "x (200,): your kernel",
                      "y (200,): your kernel"]
    assert all(ax.get_xlabel() == "element" for ax in figure.axes)
    assert figure._suptitle.get_text().startswith("1 write(s) outside y")


def test_unwritten_and_wrong_elements_name_the_first():
    message = str(_failure("triton", "map", _map_skips_the_last_program))
    assert "8 of 200 elements of y were never written (still NaN); the first: y[192]" in message
    failed = _failure("triton", "row_sum", _row_sum_of_row_zero)
    assert "5 of 6 elements of y are wrong; the first, y[1]: got " in str(failed)
    x = failed.result.accesses["x"]  # it read row 0 only, six times
    assert x.reads[x.margin:x.margin + 50].all() and not x.reads[x.margin + 50:].any()


@cuda.jit
def _unguarded(x, y, n):
    j = cuda.grid(1)
    y[j] = x[j] + 10


@cuda.jit
def _block_sum_without_a_barrier(x, y, n):  # right, by a thread per block reading global memory
    if cuda.threadIdx.x == 0:
        total = 0.0
        for k in range(64):
            g = cuda.blockIdx.x * 64 + k
            if g < n:
                total += x[g]
        y[cuda.blockIdx.x] = total


def test_numba_indexes_outside_an_array_are_refused_and_name_the_thread():
    failed = _failure("numba", "map", _unguarded)
    assert ("24 write(s) outside y (200 elements, shape (200,)); the first: a write to element "
            "offset 2") in str(failed)
    assert "thread (" in str(failed) and "of block (6, 0, 0))" in str(failed)
    assert "`if i < n:`" in str(failed)
    x = failed.result.accesses["x"]
    assert x.outside("load") == 24 and failed.result.figure is not None


def test_a_barrier_puzzle_without_a_barrier_fails_even_when_right():
    message = str(_failure("numba", "block_sum", _block_sum_without_a_barrier))
    assert "the answer is right, but the kernel never calls cuda.syncthreads()" in message


def test_the_puzzles_are_named_and_the_notebooks_state_each_task():
    with pytest.raises(ValueError, match="must be one of the triton puzzles"):
        puzzles.get("triton", "scan")
    for engine, notebook, names in (
            ("triton", "04a_triton_puzzles", ["map", "outer", "row_sum", "matmul", "masked_softmax"]),
            ("numba", "05a_cuda_puzzles", ["map", "outer", "row_sum", "matmul", "masked_softmax",
                                           "block_sum"])):
        assert [p.name for p in (puzzles.TRITON if engine == "triton" else puzzles.NUMBA)] == names
        cells = json.loads((ROOT / f"notebooks/{notebook}.ipynb").read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells)
        for k, name in enumerate(names, 1):
            p = puzzles.get(engine, name)
            assert p.task in text and p.signature in text, (notebook, name)
            grade = [c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id")
                     == f"{notebook}-p{k}-tests"]
            assert len(grade) == 1 and "### BEGIN HIDDEN TESTS" in "".join(grade[0]["source"])
            assert f'puzzles.check("{engine}", "{name}"' in "".join(grade[0]["source"])


def test_masked_softmax_needs_only_the_valid_elements():
    p = puzzles.get("triton", "masked_softmax")
    arrays, sizes = p.make(np.random.default_rng(0))
    needed = p.reads(arrays, sizes)["x"]
    assert needed.sum() == arrays["lengths"].sum() and needed[:, 0].all()


@triton.jit
def _stub(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    # YOUR CODE HERE
    raise NotImplementedError()


@cuda.jit
def _numba_stub(x, y, n):
    # YOUR CODE HERE
    raise NotImplementedError()


@pytest.mark.parametrize("engine, kernel", [("triton", _stub), ("numba", _numba_stub)])
def test_a_blank_exercise_is_said_to_be_not_written(engine, kernel):
    assert ("the kernel is not written yet (its body still raises NotImplementedError)"
            in str(_failure(engine, "map", kernel)))


def test_compiled_stores_past_the_edge_leave_a_trace_in_the_margins():
    """On a GPU the accesses are not seen; a store past the output's end still lands in its
    NaN margin, which is read back after the run."""
    import torch

    out = puzzles._padded(np.full((5, 4), np.nan, dtype=np.float32), "cpu")
    assert puzzles._margin_writes(out) == 0
    store = torch.empty(0, dtype=out.dtype).set_(out.untyped_storage())
    store[4 + 20] = 1.0  # one past the last element (the margin is a row of 4)
    store[0] = 2.0  # and one row before the first
    assert puzzles._margin_writes(out) == 2
