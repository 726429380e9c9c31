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
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 1, 300), (3, 33, 65), (5, 65, 33), (12, 2304, 768),
                                   (4, 4096, 4096)])
def test_gpu_batched_shapes(dtype, shape):
    # each matrix its own norm: the batch's matrices 1e-3 to 1e3 apart in size
    g = torch.Generator().manual_seed(sum(shape))
    G = cards.randn(shape, g, dtype, "cuda")
    G = G * torch.logspace(-3, 3, shape[0], device="cuda", dtype=dtype).view(-1, 1, 1)
    _passes(dict(G=G, steps=5, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_gpu_batched_views_and_steps(steps):
    # a transposed batch, a broadcast one (batch stride 0), padded rows
    _passes(dict(G=torch.randn(3, 50, 90, device="cuda").mT, steps=steps,
                 coefficients=COEFFICIENTS, eps=1e-7))
    _passes(dict(G=torch.randn(1, 40, 70, device="cuda").expand(4, -1, -1), steps=steps,
                 coefficients=COEFFICIENTS, eps=1e-7))
    big = torch.full((3, 60, 100), float("nan"), device="cuda")
    big[:, :, 5:85] = torch.randn(3, 60, 80, device="cuda")
    _passes(dict(G=big[:, :, 5:85], steps=steps, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
def test_gpu_batch_edges():
    fn = levels.get("cuda").newton_schulz
    assert fn(torch.randn(0, 8, 16, device="cuda")).shape == (0, 8, 16)
    with pytest.raises(ValueError, match="newton_schulz: argument 'G' must be a batch of at most"):
        fn(torch.randn(1, 2, 3, device="cuda").expand(65536, -1, -1))


@pytest.mark.gpu
def test_gpu_batched_agrees_with_level_4_and_with_one_call_per_matrix():
    G = torch.randn(6, 512, 1536, device="cuda", dtype=torch.bfloat16)
    ours = levels.get("cuda").newton_schulz(G)
    l4 = levels.get("triton").newton_schulz(G).float()
    assert ((ours.float() - l4).norm() / l4.norm()) < 3e-2
    loop = torch.stack([levels.get("cuda").newton_schulz(g) for g in G])
    assert torch.equal(ours, loop)  # the same kernels, the same order of sums: the same bits


@pytest.mark.gpu
def test_gpu_agrees_with_level_4_in_bf16():
    G = torch.randn(512, 1536, device="cuda", dtype=torch.bfloat16)
    ours = levels.get("cuda").newton_schulz(G).float()
    l4 = levels.get("triton").newton_schulz(G).float()
    assert ((ours - l4).norm() / l4.norm()) < 3e-2
