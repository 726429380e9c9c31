"""Level 5's algorithms, checked on every commit on a CPU: the numba twins (numba_kernels/)
of cuda_kernels' layer_norm and GEMM/MLP, and a flash-attention kernel, run under numba's
CUDA simulator and go through the very same harness as every level: float64 reference,
forward and backward, poisoned allocations, both layouts, the float32 bound.

The simulator runs every CUDA thread as an OS thread (about a millisecond each on two
cores) and every barrier as a round of Python polling, so the sizes are the harness's
`tiny` presets, except where the thread count says otherwise (the MLP, see its test). No
bound is loosened anywhere; the planted bugs below prove the checks can fail.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# isort: off
import numba_kernels  # before anything imports numba: switches the simulator on without a GPU
from numba import cuda
# isort: on
import levels
from equivalence import cards
from equivalence.check import check, check_case
from numba_kernels import gemm as gemm_twin
from numba_kernels import layer_norm as ln_twin
from numba_kernels import level
from numba_kernels import rope as rope_twin

# The tests marked `simulated` run the twins on CPU tensors under the simulator.
simulated = pytest.mark.skipif(
    not numba_kernels.SIMULATED,
    reason="needs numba's CUDA simulator, which this process does not have (a GPU is present, "
           "or numba was imported before numba_kernels): the gpu test runs the twins there")


def _all_pass(results):
    assert results, "nothing was checked"
    bad = [r.summary() for r in results if not r.passed]
    assert not bad, "\n".join(bad)


@pytest.fixture(autouse=True)
def no_registered_levels():
    yield
    for name in levels.registered():
        levels.unregister(name)


# ------------------------------------------------------------------ the twins pass --

@simulated
def test_layer_norm_twin_passes_the_harness_forward_and_backward():
    results = check("layer_norm", fn=level.layer_norm, size="tiny")
    assert {r.layout for r in results} == {"contiguous", "strided"}
    _all_pass(results)


@simulated
def test_rms_norm_twin_passes_the_harness_forward_and_backward():
    results = check("rms_norm", fn=level.rms_norm, size="tiny")
    assert {r.layout for r in results} == {"contiguous", "strided"}


def test_rope_twin_passes_the_harness_forward_and_backward():
    # rope.cu's indexing, run: the strided layout is q sliced from a fused qkv buffer, and
    # the backward is the same kernel rotating by -theta
    results = check("rope", fn=level.rope, size="tiny")
    assert {(r.variant, r.layout) for r in results} == {
        (v, lay) for v in ("half", "interleaved") for lay in ("contiguous", "strided")}
    _all_pass(results)


@simulated
def test_attention_twin_passes_the_harness_as_a_registered_level():
    # registered like a student's module: `levels.register` is the route the notebook shows
    levels.register("numba", level)
    results = check("attention", "numba", size="tiny")
    # gqa and decode: the Level 5 algorithm grown (grouped K/V heads, a head size of 24,
    # causal diagonals for Nq != Nk, kv_lens), as cuda_kernels/attention.cu's v2 and backward;
    # rope: the rope twin then the attention twin (unfused)
    assert {(r.variant, r.layout) for r in results} == {
        (v, layout) for v in ("full", "causal", "gqa", "decode", "rope")
        for layout in ("contiguous", "strided")}
    _all_pass(results)
    assert levels.status("numba", "cpu", "lstm") == "'numba' has no lstm function"


# The MLP runs six GEMMs (two forward, four backward), each at least one block of gemm.cu's
# 32x32 = 1024 threads: the tiny preset (18 x 24 -> 72 -> 20) makes 14 such blocks, minutes in
# the simulator. So the twin runs a smaller explicit case, in both layouts (row-padded x,
# transposed weights, interleaved biases), with no bound changed: at 32x32 it is one block per
# GEMM; the same kernel source compiled for an 8x8 tile crosses tiles in every dimension
# (K = 10 and 12: two K tiles, a ragged last one) and so checks the K loop and its barriers.
MLP_SMALL = dict(rows=(2, 3), K=10, hidden=12, N=7)


@simulated
@pytest.mark.parametrize("layout", cards.LAYOUTS)
def test_mlp_twin_with_gemm_cu_32x32_tiles_passes_the_harness(layout):
    _all_pass([check_case("mlp", None, "float32", "cpu", MLP_SMALL, "default", layout=layout,
                          fn=level.mlp)])


@simulated
def test_mlp_twin_across_8x8_tiles_passes_the_harness():
    mlp8 = functools.partial(level.mlp, tile=8)
    _all_pass([check_case("mlp", None, "float32", "cpu", MLP_SMALL, "default", layout=layout,
                          fn=mlp8) for layout in cards.LAYOUTS])


@simulated
def test_gemm_epilogues_and_column_sum_match_float64():
    # The MLP uses gelu_save, none and gelu_grad; "gelu" alone and a bias read with a stride
    # are checked here, on operands given as views (a transposed B, a stride-2 bias).
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 9, generator=g)
    b_store = torch.randn(6, 9, generator=g)  # b = b_store.t(): a (9, 6) view, column-major
    bias = torch.randn(12, generator=g)[::2]
    kernels = gemm_twin.gemm_kernels(8)
    exact = a.double() @ b_store.double().t() + bias.double()
    got = gemm_twin.gemm(a, b_store.t(), bias, "gelu", kernels=kernels)
    want = torch.nn.functional.gelu(exact)
    assert float((got.double() - want).norm() / want.norm()) < 1e-6
    plain = gemm_twin.gemm(a, b_store.t(), kernels=kernels)
    assert float((plain.double() - (exact - bias.double())).norm() / exact.norm()) < 1e-6
    sums = gemm_twin.column_sum(b_store.t())  # (9, 6) column-major: strided rows
    assert torch.allclose(sums.double(), b_store.double().sum(1), rtol=1e-6, atol=1e-6)


@simulated
def test_bfloat16_is_computed_in_float32_and_returned_in_bfloat16():
    result = check_case("layer_norm", None, "bfloat16", "cpu", dict(rows=(3,), N=40), "default",
                        layout="strided", fn=level.layer_norm)
    _all_pass([result])  # the comparisons include dtype: out and every grad are bfloat16


@simulated
def test_float64_and_unrunnable_devices_are_refused_by_name():
    x = torch.randn(2, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"argument 'x' must be float32, float16 or bfloat16.*float64"):
        level.layer_norm(x, torch.ones(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64))
    assert "simulator is on" in level.unavailable_reason("cuda")
    assert level.unavailable_reason("cpu") is None
    assert "no numba twin of conv_bn" in level.unavailable_reason("cpu", "conv_bn")


# ------------------------------------------------------------------ planted bugs --

@simulated
def test_a_reduction_tree_that_stops_one_step_early_is_caught():
    # (`cuda` must be a module global in kernel code: the simulator swaps its fake CUDA module
    # in for the global name while a kernel runs, not for a local import.)
    @cuda.jit(device=True)
    def stops_early(v, scratch):
        t = cuda.threadIdx.x
        cuda.syncthreads()
        scratch[t] = v
        cuda.syncthreads()
        offset = cuda.blockDim.x // 2
        while offset > 1:  # the last step (offset 1) never runs: half of the sum is lost
            if t < offset:
                scratch[t] += scratch[t + offset]
            cuda.syncthreads()
            offset //= 2
        return scratch[0]

    buggy = functools.partial(level.layer_norm, kernels=ln_twin.row_kernels(block_sum=stops_early))
    [result] = check("layer_norm", fn=buggy, size="tiny", layout="contiguous")
    assert result.status == "fail", result.summary()
    assert not next(c for c in result.comparisons if c.name == "out").ok


@simulated
def test_a_gelu_derivative_without_its_density_term_is_caught_in_backward_only(monkeypatch):
    @cuda.jit(device=True)
    def cdf_only(v):  # d/dx [x Phi(x)] = Phi(x) + x phi(x): the x phi(x) term forgotten
        return 0.5 * (1.0 + math.erf(v * 0.7071067811865476))

    # In the simulator the kernel looks `gelu_grad` up when it runs, so the patch takes effect.
    monkeypatch.setattr(gemm_twin, "gelu_grad", cdf_only)
    result = check_case("mlp", None, "float32", "cpu", MLP_SMALL, "default",
                        fn=functools.partial(level.mlp, tile=8))
    assert result.status == "fail", result.summary()
    failed = {c.name for c in result.comparisons if not c.ok}
    assert "out" not in failed  # the forward never calls it ...
    assert {"grad x", "grad w1", "grad b1"} <= failed  # ... every gradient through dH does


def test_the_twins_mirror_cpp_that_exists():
    """Each twin names the C++ it mirrors; if gemm.cu or layer_norm.cu renames or retiles
    those kernels, the twin (and its comments) must follow."""
    kernels = Path(__file__).resolve().parent.parent / "cuda_kernels"
    common = (kernels / "common.cuh").read_text()
    quoted = next(line.strip() for line in ln_twin.__doc__.splitlines() if "__shfl_xor_sync(" in line)
    assert quoted in common, f"layer_norm.py quotes a line common.cuh no longer has: {quoted}"
    layer_norm_cu = (kernels / "layer_norm.cu").read_text()
    for name in ("fwd_v3_loop", "bwd_dx_v2", "bwd_dwdb_partial_v2", "sum_partials", "block_sum2"):
        assert f" {name}(" in layer_norm_cu, f"layer_norm.cu has no {name}"
    rms_norm_cu = (kernels / "rms_norm.cu").read_text()
    for name in ("fwd_v2", "bwd_dx_v2", "bwd_dw_partial_v2", "sum_partials"):
        assert f" {name}(" in rms_norm_cu, f"rms_norm.cu has no {name}"
    gemm_cu = (kernels / "gemm.cu").read_text()
    assert f"constexpr int V2_TILE = {gemm_twin.TILE};" in gemm_cu
    for name in ("gemm_v2_kernel", "column_sum_kernel", "finish", "gelu_grad"):
        assert f" {name}(" in gemm_cu, f"gemm.cu has no {name}"
    rope_cu = (kernels / "rope.cu").read_text()
    assert f"constexpr int V2_ROWS = {rope_twin.ROWS};" in rope_cu and " rope_v2(" in rope_cu
    assert "y1 = x1 * c - x2 * s;" in (kernels / "rope.cuh").read_text()


# ------------------------------------------------------------------ on a GPU --

def test_every_twin_compiles_for_a_gpu_without_one():
    """The simulator runs the kernels' Python, it never compiles them: numba's CUDA target
    must accept the same source (numba_kernels/ptx.py). libNVVM is enough, no GPU."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-m", "numba_kernels.ptx", "--cc", "9.0"], check=False,
                          env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 15, proc.stdout


@pytest.mark.gpu
def test_twins_pass_the_harness_on_a_gpu():
    """The same kernels compiled by numba for the GPU (run where the simulator is off)."""
    if numba_kernels.SIMULATED:
        pytest.skip("numba's simulator is on in this process: the twins cannot reach the GPU")
    _all_pass(check("layer_norm", fn=level.layer_norm, device="cuda", size="tiny")
              + check("mlp", fn=level.mlp, device="cuda", size="tiny")
              + check("attention", fn=level.attention, device="cuda", size="tiny")
              + check("rms_norm", fn=level.rms_norm, device="cuda", size="tiny"))


# ------------------------------------------------------- the simulator's shared memory --

def _threads_racing_for_one_shared_array(shared_array, n_threads=64, trials=40):
    """How many distinct arrays `n_threads` threads of one simulated block got from the same
    `cuda.shared.array` line, at worst over `trials` launches (1 is right: one per block)."""
    import threading

    import numpy as np
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    worst = 0
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL round as often as Python allows: provoke races
    try:
        for _ in range(trials):
            shared = FakeCUDAShared(0)
            start = threading.Barrier(n_threads)
            got = [None] * n_threads

            def thread(i):
                start.wait()
                got[i] = id(shared_array(shared, (8, 9), np.float32))

            threads = [threading.Thread(target=thread, args=(i,)) for i in range(n_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            worst = max(worst, len(set(got)))
    finally:
        sys.setswitchinterval(before)
    return worst


@simulated
def test_simulated_shared_memory_is_one_array_per_block_even_when_threads_race():
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    from numba_kernels import simulator

    assert FakeCUDAShared.array is simulator._shared_array, "numba_kernels did not install the fix"
    assert _threads_racing_for_one_shared_array(FakeCUDAShared.array, trials=100) == 1


@simulated
def test_numbas_own_shared_array_does_race_which_is_why_it_is_patched():
    # If this starts failing, numba fixed the race upstream: the patch can go.
    from numba_kernels import simulator

    worst = 0
    # The race is a few percent per launch on a quiet machine, rarer on a loaded one (the
    # threads then seldom run the check and the insert at once): up to 30 x 40 launches,
    # stopping at the first race (usually within the first 40).
    for _ in range(30):
        worst = max(worst, _threads_racing_for_one_shared_array(simulator.original_shared_array()))
        if worst > 1:
            break
    assert worst > 1, "numba's unpatched FakeCUDAShared.array never raced in 1200 launches"


@simulated
def test_patched_shared_arrays_keep_one_array_per_line_and_dynamic_memory():
    import numpy as np
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    shared = FakeCUDAShared(64)
    a = shared.array((4,), np.float32)
    b = shared.array((4,), np.float32)   # another line: another array
    again = [shared.array((4,), np.float32) for _ in range(2)]  # one line, twice: the same
    assert a is not b and again[0] is again[1] and again[0] is not a
    assert shared.array(0, np.dtype(np.float32)).nbytes == 64  # dynamic shared memory: numba's own


_LATE_DEVICE_FUNCTION = '''
import threading
from numba import cuda

zero_in, all_in, left = threading.Event(), threading.Event(), threading.Event()
inside = [0]
lock = threading.Lock()

@cuda.jit(device=True)
def late_index(t, others):
    # thread 0 is inside first and leaves while every other thread is inside; they read
    # cuda.threadIdx only after it has left
    if t == 0:
        zero_in.set()
        all_in.wait(5)
    else:
        with lock:
            inside[0] += 1
            if inside[0] == others:
                all_in.set()
        left.wait(5)
    return cuda.threadIdx.x
'''


def _launch_with_a_device_function_from_another_module():
    """A kernel of this module calling a device function of another module (as a notebook's
    exercise is), whose first thread returns while the others are still inside."""
    import types

    import numpy as np
    other = types.ModuleType("late_device_function")
    exec(_LATE_DEVICE_FUNCTION, other.__dict__)

    @cuda.jit
    def kernel(out):
        t = cuda.threadIdx.x
        if t != 0:
            other.zero_in.wait(5)
        out[t] = other.late_index(t, 7)
        if t == 0:
            other.left.set()

    out = np.full(8, -1, np.int32)
    kernel[1, 8](out)
    return out


@simulated
def test_a_device_function_of_another_module_sees_the_fake_cuda_until_every_thread_left():
    from numba.cuda.simulator import kernel

    from numba_kernels import simulator

    assert kernel.swapped_cuda_module is simulator._swapped_cuda_module, "the fix is not installed"
    assert _launch_with_a_device_function_from_another_module().tolist() == list(range(8))
    assert not simulator._SWAPS  # every module has its own cuda back


@simulated
def test_numbas_own_module_swap_does_race_which_is_why_it_is_counted(monkeypatch):
    # If this starts failing, numba fixed the race upstream: the patch can go.
    from numba.cuda.simulator import kernel, kernelapi

    monkeypatch.setattr(kernel, "swapped_cuda_module", kernelapi.swapped_cuda_module)
    with pytest.raises(AttributeError, match="has no attribute 'threadIdx'"):
        _launch_with_a_device_function_from_another_module()
