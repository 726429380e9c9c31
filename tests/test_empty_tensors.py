"""Empty tensors (a batch of 0, rope's no positions) give torch's result at every level.

tests/test_bad_inputs.py holds each level's values to the float64 reference ("computed (empty,
zero ... gradients, as torch)"). This file holds what a reference cannot see: that Level 4 and
the numba twins launch no kernel for them, that the parameters' gradients are exactly zero
in their parameter's shape and dtype at Levels 1-4 and in the twins, that conv_bn's running
statistics are left bit for bit as they were (torch's batch_norm returns before it tracks a
batch of no value), and, on a GPU, the same of Level 5 under poisoned allocations (an
at::empty gradient that no kernel wrote would be NaN there, not a lucky zero).

    pytest tests/test_empty_tensors.py            the CPU part (Levels 1-4, the numba twins)
    pytest -m gpu tests/test_empty_tensors.py     on a GPU: Levels 4 and 5, the twins there
"""

from __future__ import annotations

# isort: off
import numba_kernels  # noqa: F401 - before anything imports numba: the simulator without a GPU
import levels
# isort: on

import pytest
import torch

from equivalence import cards
from equivalence.check import flatten, poisoned_allocations
from numba_kernels import level as numba_level
from tests.test_bad_inputs import BY_KEY, TORCH_OPS

COMPONENTS = ("mlp", "lstm", "conv_bn", "rms_norm", "rope", "swiglu_mlp")
KEYS = sorted(k for k, b in BY_KEY.items() if b.component in COMPONENTS
              and b.slug in ("empty", "empty-train", "no-positions"))
TWIN_KEYS = [k for k in KEYS if BY_KEY[k].component in numba_level.COMPONENTS]


def _call_and_differentiate(key: str, fn, device: str) -> None:
    """Call fn on the row's arguments; check the outputs' shapes and dtypes against torch's
    own operators, then differentiate: empty inputs get empty gradients, parameters zeros."""
    bad = BY_KEY[key]
    args = bad.args(device)
    case = cards.get(bad.component).case_from_args(args)
    buffers = {name: args[name].clone() for name in case.mutated}
    want = flatten(TORCH_OPS[bad.component](**{k: v.detach() if isinstance(v, torch.Tensor) else v
                                             for k, v in args.items()}))
    outs = flatten(fn(**args))
    for got, ref in zip(outs, want):
        assert (got.shape, got.dtype, got.device) == (ref.shape, ref.dtype, ref.device), key
    for name, before in buffers.items():  # conv_bn in training: nothing tracked
        assert torch.equal(args[name], before), f"{key}: {name} changed"
    leaves = {name: t for name, t in args.items() if isinstance(t, torch.Tensor) and t.requires_grad}
    returned = outs[:case.n_returned]
    grads = torch.autograd.grad(returned, list(leaves.values()),
                                [torch.randn_like(o) for o in returned])
    for (name, leaf), g in zip(leaves.items(), grads):
        assert (g.shape, g.dtype, g.device) == (leaf.shape, leaf.dtype, leaf.device), (key, name)
        assert torch.equal(g, torch.zeros_like(leaf)), f"{key}: grad {name} is not all zeros"


@pytest.fixture
def triton_launches(monkeypatch):
    """Every Triton kernel launch of the test, by kernel name (compiled or interpreted)."""
    from triton.runtime import interpreter, jit

    launched = []
    for cls in (jit.JITFunction, interpreter.InterpretedFunction):
        def run(self, *args, _original=cls.run, **kwargs):
            if not kwargs.get("warmup"):
                launched.append(getattr(getattr(self, "fn", None), "__name__", repr(self)))
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, "run", run)
    return launched


@pytest.mark.parametrize("level", ["native", "torchscript", "compile"])
@pytest.mark.parametrize("key", KEYS)
def test_levels_1_to_3(key, level):
    if levels.status(level, "cpu", BY_KEY[key].component):
        pytest.skip(levels.status(level, "cpu", BY_KEY[key].component))
    _call_and_differentiate(key, getattr(levels.get(level), BY_KEY[key].component), "cpu")


def _level4(key, device, launched):
    component = BY_KEY[key].component
    reason = levels.status("triton", device, component)
    if reason:
        pytest.skip(reason)
    _call_and_differentiate(key, getattr(levels.get("triton"), component), device)
    assert launched == [], f"{key}: Level 4 launched {launched} on an empty problem"


@pytest.mark.parametrize("key", KEYS)
def test_level_4_launches_nothing(key, triton_launches):
    _level4(key, "cpu", triton_launches)


@pytest.fixture
def numba_launches(monkeypatch):
    """Every numba kernel launch of the test (the simulator's kernels; on a GPU, numba's)."""
    launched = []
    if numba_kernels.SIMULATED:  # kernel[grid, block](*args) calls the configured kernel
        from numba.cuda.simulator.kernel import FakeCUDAKernel as Kernel
        method = "__call__"
    else:  # ... or, compiled, the dispatcher's call(args, grid, block, ...)
        from numba.cuda.dispatcher import CUDADispatcher as Kernel
        method = "call"
    original = getattr(Kernel, method)

    def call(self, *args, **kwargs):
        fn = getattr(self, "py_func", None) or getattr(self, "fn", None)
        launched.append(getattr(fn, "__name__", repr(self)))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(Kernel, method, call)
    return launched


def _twin(key, device, launched):
    reason = numba_level.unavailable_reason(device, BY_KEY[key].component)
    if reason:
        pytest.skip(reason)
    _call_and_differentiate(key, getattr(numba_level, BY_KEY[key].component), device)
    assert launched == [], f"{key}: the numba twin launched {launched} on an empty problem"


@pytest.mark.parametrize("key", TWIN_KEYS)
def test_numba_twin_launches_nothing(key, numba_launches):
    _twin(key, "cpu", numba_launches)


# ------------------------------------------------------------------ on a GPU --

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("key", KEYS)
def test_level_5_on_a_gpu(key):
    component = BY_KEY[key].component
    reason = levels.status("cuda", "cuda", component)
    if reason:
        pytest.fail(f"Level 5 cannot run here: {reason}")
    with poisoned_allocations():
        _call_and_differentiate(key, getattr(levels.get("cuda"), component), "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("key", KEYS)
def test_level_4_launches_nothing_on_a_gpu(key, triton_launches):
    _level4(key, "cuda", triton_launches)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("key", TWIN_KEYS)
def test_numba_twin_launches_nothing_on_a_gpu(key, numba_launches):
    _twin(key, "cuda", numba_launches)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_level_5_gemm_ops_zero_fill_empty_sums():
    # The binding itself, under the MLP's, the LSTM's and the SwiGLU MLP's weight gradients:
    # a sum over K = 0 terms and a column sum of no rows are zeros, not at::empty's memory.
    from cuda_kernels import mlp as k_mlp

    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(24, 0, device="cuda", dtype=dtype)
        b = torch.randn(0, 40, device="cuda", dtype=dtype)
        with poisoned_allocations():
            for version in sorted(k_mlp.VERSIONS):
                if version >= 5 and torch.cuda.get_device_capability() != (9, 0):  # wgmma
                    continue
                assert torch.equal(k_mlp.gemm(a, b, version=version),
                                   torch.zeros(24, 40, device="cuda", dtype=dtype)), version
            assert torch.equal(k_mlp.column_sum(b), torch.zeros(40, device="cuda", dtype=dtype))
