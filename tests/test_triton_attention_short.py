"""Level 4 attention's one-pass backward for short key sequences (`_attn_bwd_short`): where a
head's keys fit one block, one launch computes dQ, dK and dV (triton_kernels/attention.py).

Every case asserts which backward ran (the launches are counted) and passes the harness:
every gradient against the float64 reference, poisoned allocations. Without a GPU the
interpreter's limit is 16 keys (SHORT_KEYS), so the cases stay small; @pytest.mark.gpu
repeats them at 77 and 128 keys, where the GPU takes this path.
"""

from __future__ import annotations

import math

import pytest
import torch

import levels.triton  # noqa: F401  (first: the interpreter on before triton loads)
import triton_kernels.attention as kernels
from equivalence.check import check_args

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class _Counting:
    """Wraps a kernel: `kernel[grid](...)` counted, then launched."""

    def __init__(self, kernel, counts, name):
        self.kernel, self.counts, self.name = kernel, counts, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counts[self.name] = self.counts.get(self.name, 0) + 1
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.fixture
def launches(monkeypatch):
    counts: dict = {}
    for name in ("_attn_bwd_short", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_preprocess"):
        monkeypatch.setattr(kernels, name, _Counting(getattr(kernels, name), counts, name))
    return counts


def _args(B=2, H=2, H_kv=None, Nq=9, Nk=None, D=16, dtype=torch.float32, causal=False,
          alignment="top_left", kv_lens=None, rope=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    H_kv = H if H_kv is None else H_kv
    Nk = Nq if Nk is None else Nk
    mk = lambda h, n: torch.randn((B, h, n, D), generator=g).to(dtype=dtype, device=DEVICE)  # noqa: E731
    args = dict(q=mk(H, Nq), k=mk(H_kv, Nk), v=mk(H_kv, Nk), causal=causal, scale=None)
    if alignment != "top_left" or kv_lens is not None:
        args.update(causal_alignment=alignment,
                    kv_lens=None if kv_lens is None else torch.tensor(kv_lens, device=DEVICE))
    if rope is not None:  # rope = interleaved (a bool): random angles for Nk + 2 positions
        theta = torch.rand((Nk + 2, D // 2), generator=g) * 2 * math.pi
        args["rope"] = (torch.cos(theta).to(dtype=dtype, device=DEVICE),
                        torch.sin(theta).to(dtype=dtype, device=DEVICE), rope)
    return args


CASES = {
    "plain": dict(),
    "causal bf16": dict(causal=True, dtype=torch.bfloat16),
    # more queries than one query block (the loop inside the program), a chunk after a
    # cache (bottom-right), four query heads on two K/V heads (dK, dV summed over the group)
    "grouped chunk": dict(H=4, H_kv=2, Nq=40, Nk=12, causal=True, alignment="bottom_right"),
    # a length of 0 (no key: every gradient 0), one inside, one past Nk (clipped)
    "key lengths": dict(B=3, Nq=11, Nk=13, causal=True, kv_lens=[0, 5, 20]),
    "padded head": dict(D=24, Nq=7, Nk=10),
    "rope half-split": dict(H=4, H_kv=1, Nq=6, Nk=14, causal=True, alignment="bottom_right",
                            rope=False),
    "rope interleaved": dict(Nq=12, causal=True, rope=True),
}


@pytest.mark.parametrize("case", CASES)
def test_short_keys_take_the_one_pass_backward(case, launches):
    args = _args(**CASES[case])
    r = check_args("attention", "triton", args)
    assert r.passed, r.summary()
    assert launches.get("_attn_bwd_short", 0) >= 1, launches
    assert "_attn_bwd_dkdv" not in launches and "_attn_bwd_dq" not in launches, launches


def test_longer_keys_keep_the_split_backward(launches):
    args = _args(Nq=9, Nk=kernels.SHORT_KEYS + 1, causal=True)
    r = check_args("attention", "triton", args)
    assert r.passed, r.summary()
    assert "_attn_bwd_short" not in launches
    assert launches.get("_attn_bwd_dkdv", 0) >= 1 and launches.get("_attn_bwd_dq", 0) >= 1


def test_one_pass_and_split_backward_agree():
    # the same gradients both ways (up to the summation order of fp32 accumulators)
    args = _args(H=4, H_kv=2, Nq=13, Nk=11, causal=True)
    q, k, v = (args[n].clone().requires_grad_() for n in ("q", "k", "v"))
    grads = []
    for config in (None, kernels.TUNED["interpreted_bwd"] if kernels.INTERPRETED else kernels.TUNED["bwd"]):
        q.grad = k.grad = v.grad = None
        out = kernels.attention(q, k, v, True, q.shape[-1] ** -0.5, backward_config=config)
        out.backward(torch.ones_like(out))
        grads.append([t.grad.clone() for t in (q, k, v)])
    for one, split in zip(*grads):
        assert torch.allclose(one, split, rtol=1e-4, atol=1e-5)


def test_the_rule_names_its_limits():
    assert kernels._short_config(9, kernels.SHORT_KEYS, 64, torch.bfloat16) is not None
    assert kernels._short_config(9, kernels.SHORT_KEYS + 1, 64, torch.bfloat16) is None
    assert kernels._short_config(9, 8, kernels.SHORT_HEAD * 2, torch.bfloat16) is None


# ---- on a GPU: the shapes the path is for ------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [dict(B=4, H=12, Nq=77), dict(B=2, H=8, H_kv=2, Nq=128, causal=True),
                                   dict(B=2, H=4, Nq=300, Nk=100, causal=True, alignment="bottom_right"),
                                   dict(B=3, H=2, Nq=50, Nk=64, D=48, kv_lens=[0, 33, 64])])
def test_gpu_short_keys(dtype, shape, launches):
    shape = dict(dict(D=64), **shape)
    r = check_args("attention", "triton", _args(dtype=dtype, seed=shape["Nq"], **shape))
    assert r.passed, r.summary()
    keys = shape.get("Nk", shape["Nq"])
    expected = kernels._short_config(shape["Nq"], keys, kernels.head_tile(shape["D"]), dtype) is not None
    assert ("_attn_bwd_short" in launches) == expected, launches
