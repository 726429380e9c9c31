"""Level 5 (CUDA): newton_schulz, version 1 of cuda_kernels/newton_schulz.cu.

On a CPU: the level says why it cannot run (the harness's skip), and the kernel op's
contract is held by its CPU twin in tests/test_cuda_autograd_cpu.py. On a GPU (marked `gpu`):
the harness at every dtype and layout, odd and model shapes wide and tall, every number of
steps, views read through their strides, and the symmetric kernel's output never leaving a
NaN where a mirror store should have written.
"""

from __future__ import annotations

import pytest
import torch

import levels
from equivalence import cards
from equivalence.check import check, check_args

COMPONENT = "newton_schulz"
COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def _passes(args):
    r = check_args(COMPONENT, "cuda", args)
    assert r.passed, r.summary()


def test_without_a_gpu_the_level_says_why():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (r, *_) = check(COMPONENT, "cuda", layout="contiguous")
    assert r.status == "skip" and "GPU" in r.reason


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_gpu_harness(dtype, size):
    for r in check(COMPONENT, "cuda", dtype=dtype, device="cuda", size=size):
        assert r.status == "pass", f"{r.layout}: {r.status} {r.reason} {r.worst}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 300), (300, 1), (33, 65), (768, 3072),
                                        (2304, 768), (4096, 4096)])
def test_gpu_shapes(dtype, rows, cols):
    g = torch.Generator().manual_seed(rows + cols)
    G = cards.randn((rows, cols), g, dtype, "cuda")
    _passes(dict(G=G, steps=5, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [0, 1, 2, 3, 6])
def test_gpu_every_number_of_steps(steps):
    G = torch.randn(70, 130, device="cuda")
    _passes(dict(G=G, steps=steps, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
def test_gpu_views_are_read_where_they_lie():
    _passes(dict(G=torch.randn(90, 50, device="cuda").t(), steps=5, coefficients=COEFFICIENTS,
                 eps=1e-7))
    big = torch.full((100, 300), float("nan"), device="cuda")
    big[::2, 1::3] = torch.randn(50, 100, device="cuda")
    _passes(dict(G=big[::2, 1::3], steps=5, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
def test_gpu_agrees_with_level_4_in_bf16():
    G = torch.randn(512, 1536, device="cuda", dtype=torch.bfloat16)
    ours = levels.get("cuda").newton_schulz(G).float()
    l4 = levels.get("triton").newton_schulz(G).float()
    assert ((ours - l4).norm() / l4.norm()) < 3e-2
