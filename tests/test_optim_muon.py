"""levels.optim.Muon: one step against the update written out by hand, the same step at
every level that runs here, its refusals, and `levels train --optimizer muon` agreeing with
native's loss curve (tiny GPT, Levels 1-2: a few seconds)."""

from __future__ import annotations

import copy

import pytest
import torch

import levels  # first: it switches Triton's interpreter on where there is no GPU
from equivalence.commands.training import train
from levels.optim import Muon, split_parameters

COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def _by_hand(W, g, buf, lr, momentum=0.95, steps=5):
    """One Muon step in float64, op by op (Nesterov momentum from a zero buffer)."""
    buf = momentum * buf + g
    u = g + momentum * buf
    a, b, c = COEFFICIENTS
    X = u.t() if u.shape[0] > u.shape[1] else u
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.t()
        X = a * X + (b * A + c * A @ A) @ X
    X = X.t() if u.shape[0] > u.shape[1] else X
    return W - lr * max(1.0, W.shape[0] / W.shape[1]) ** 0.5 * X, buf


@pytest.mark.parametrize("shape", [(12, 20), (20, 12)])
def test_two_steps_match_the_update_by_hand(shape):
    torch.manual_seed(0)
    W = torch.nn.Parameter(torch.randn(shape))
    bias = torch.nn.Parameter(torch.randn(shape[0]))
    opt = Muon([W], [bias], lr=0.05, ns_dtype=None)
    want, buf = W.detach().double(), torch.zeros(shape, dtype=torch.float64)
    for _ in range(2):
        g = torch.randn(shape)
        W.grad, bias.grad = g.clone(), torch.randn(shape[0])
        bias_before = bias.detach().clone()
        opt.step()
        want, buf = _by_hand(want, g.double(), buf, 0.05)
        assert not torch.equal(bias.detach(), bias_before)  # AdamW moved the 1-D parameter
    assert ((W.detach().double() - want).norm() / want.norm()) < 1e-5


def test_one_batched_call_per_shape_and_each_parameter_its_own_step():
    # two (12, 20) weights and one (20, 12): two newton_schulz calls, a batch of 2 and one
    # of 1, and every weight where the by-hand step of its own puts it, over three steps in
    # which one weight has no gradient once (its buffer waits; the group's stack is rebuilt)
    torch.manual_seed(2)
    shapes = [(12, 20), (20, 12), (12, 20)]
    Ws = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = Muon(Ws, lr=0.05, ns_dtype=None)
    calls = []
    native = opt._newton_schulz
    opt._newton_schulz = lambda G, steps: calls.append(tuple(G.shape)) or native(G, steps=steps)
    want = [W.detach().double() for W in Ws]
    bufs = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    for step in range(3):
        skip = 2 if step == 1 else None
        for i, W in enumerate(Ws):
            g = torch.randn(shapes[i])
            W.grad = None if i == skip else g
            if i != skip:
                want[i], bufs[i] = _by_hand(want[i], g.double(), bufs[i], 0.05)
        opt.step()
    assert sorted(calls[:2]) == [(1, 20, 12), (2, 12, 20)] and (1, 12, 20) in calls[2:4]
    for W, w in zip(Ws, want):
        assert ((W.detach().double() - w).norm() / w.norm()) < 1e-5
    # each parameter's state is its row of the group's one stacked buffer
    rows = [opt.state[W]["momentum_buffer"] for W in (Ws[0], Ws[2])]
    assert rows[0]._base is not None and rows[0]._base is rows[1]._base


def test_state_dict_round_trip_continues_the_same_steps():
    torch.manual_seed(3)
    Ws = [torch.nn.Parameter(torch.randn(8, 16)) for _ in range(2)]
    twins = [torch.nn.Parameter(W.detach().clone()) for W in Ws]
    a, b = Muon(Ws, lr=0.05, ns_dtype=None), Muon(twins, lr=0.05, ns_dtype=None)
    for step in range(3):
        gs = [torch.randn(8, 16) for _ in Ws]
        for W, T, g in zip(Ws, twins, gs):
            W.grad, T.grad = g.clone(), g.clone()
        if step == 2:  # b's buffers replaced by loaded copies (as from a checkpoint file):
            b.load_state_dict(copy.deepcopy(a.state_dict()))  # its stack is rebuilt from them
        a.step()
        b.step()
    for W, T in zip(Ws, twins):
        assert torch.equal(W, T)


def test_every_level_takes_the_same_step():
    shape = (10, 18)
    results = {}
    for level in ("native", "torchscript", "triton"):
        if levels.status(level, "cpu", "newton_schulz"):
            continue
        torch.manual_seed(1)
        W = torch.nn.Parameter(torch.randn(shape))
        W.grad = torch.randn(shape)
        Muon([W], lr=0.05, level=level, ns_dtype=None).step()
        results[level] = W.detach()
    assert "native" in results and len(results) >= 2
    for level, got in results.items():
        assert ((got - results["native"]).norm() / results["native"].norm()) < 1e-5, level


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match="Muon: argument 'muon_params' must hold 2-D"):
        Muon([torch.nn.Parameter(torch.randn(4))])
    with pytest.raises(ValueError, match="argument 'level'"):
        Muon([torch.nn.Parameter(torch.randn(4, 4))], level="fast")


def test_split_leaves_embeddings_and_the_head_to_adamw():
    from levels.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab=50, d_model=16, n_heads=2, n_layers=1, seq_len=8))
    hidden, rest = split_parameters(model)
    assert hidden and all(p.dim() == 2 for p in hidden)
    assert not any(p is model.tok.weight or p is model.pos.weight for p in hidden)
    assert len(hidden) + len(rest) == len(list(model.parameters()))


def test_train_with_muon_agrees_with_native():
    report = train("gpt", ("native", "torchscript"), (), "tiny", steps=4, device="cpu",
                   optimizer="muon")
    assert report["settings"]["optimizer_name"] == "muon"
    assert [r["status"] for r in report["runs"]] == ["ok", "ok"]
    assert all(a["passed"] for a in report["agreement"]["runs"].values())
    assert all(r["timing"]["median_optimizer_ms"] is not None for r in report["runs"])
