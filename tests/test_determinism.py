"""Determinism: the same inputs twice give bitwise the same outputs and gradients, at every
level that runs here (tiny sizes, float32, both layouts, every variant; on a GPU, every
level at 'small' in float32 and bfloat16, run by `pytest -m gpu`).

A level that is not deterministic must say why (atomics, autotuning) and the case is an
xfail(strict=True) with that reason here. On the CPU none is: Levels 1-3 call the same
library kernels with fixed threading, and Level 4 (the interpreter) reduces without atomics
(triton_kernels/layer_norm.py, conv_bn.py, gemm.py say so).

TorchScript is deterministic for the graph it runs, but which graph that is depends on how
often the shape was seen: its profiling executor runs a plain graph for the first calls of a
shape, then a fused, specialized one, and the two round differently (fusion changes the order
of operations). So within one process its first calls and its later ones may differ in the
last bits (levels/torchscript.py says so), and the comparison here is made once it has
settled (WARM_CALLS first); a test run alone and the full suite then agree.
"""

from __future__ import annotations

import pytest
import torch

import levels
import levels.triton  # noqa: F401  (first: the interpreter must be on before triton loads)
from equivalence import cards
from equivalence.check import poisoned_allocations, reference_case, run_case
from levels.contract import COMPONENTS

# Calls made before the two that are compared, per level: TorchScript optimizes a shape after
# its profiling runs (two by default), and must be compared on the graph it settles on.
WARM_CALLS = {"torchscript": 3}

CASES = [(c, v, lay) for c in COMPONENTS for v in cards.get(c).variants for lay in cards.LAYOUTS]


@pytest.mark.parametrize("level", ("native", "torchscript", "compile", "triton"))
@pytest.mark.parametrize("component, variant, layout", CASES)
def test_same_inputs_give_the_same_bits(level, component, variant, layout):
    _same_bits(level, component, variant, layout, "tiny", torch.float32, "cpu")


# On a GPU: every level, at 'small' (several blocks per row or tile: where a split
# reduction or an atomic would show) in float32 and bfloat16, under the harness's own
# setting (torch.use_deterministic_algorithms, which poisoned_allocations switches on: it
# makes cuBLAS and cuDNN pick their deterministic algorithms).
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("float32", "bfloat16"))
@pytest.mark.parametrize("level", levels.LEVEL_NAMES)
@pytest.mark.parametrize("component, variant, layout", CASES)
def test_same_inputs_give_the_same_bits_on_gpu(level, component, variant, layout, dtype):
    _same_bits(level, component, variant, layout, "small", dtype, "cuda")


def _same_bits(level, component, variant, layout, size, dtype, device):
    reason = levels.status(level, device, component)
    if reason:
        pytest.skip(f"{level}: {reason}")
    case = cards.get(component).case(size, variant, dtype, device, seed=3, layout=layout)
    _, _, upstream, _ = reference_case(case, seed=3)
    fn = getattr(levels.get(level), component)
    runs = []
    for _ in range(WARM_CALLS.get(level, 0)):
        with poisoned_allocations():
            run_case(fn, case, upstream=upstream)
    for _ in range(2):
        with poisoned_allocations():  # NaN where nothing was written: unwritten memory differs
            runs.append(run_case(fn, case, upstream=upstream))
    (outs1, grads1), (outs2, grads2) = runs
    for name, a, b in zip(case.outputs, outs1, outs2):
        assert torch.equal(a, b), f"{level} {component}[{variant}, {layout}] {dtype}: {name} differs"
    for name, a, b in zip(case.differentiable, grads1, grads2):
        assert torch.equal(a, b), f"{level} {component}[{variant}, {layout}] {dtype}: grad {name} differs"
