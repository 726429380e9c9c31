"""`levels train --breakdown`: a training step's time charged to the layers that spent it."""

import pytest
import torch

from equivalence.commands import training as T
from equivalence.commands.breakdown import _outermost, breakdown


def _model(name: str):
    p = T.preset(name, "tiny")
    batches, _, _, _, _, vocab = T.make_data(name, p, 0)
    twin = T.build_twin(name, p["config"], vocab)
    return p, batches, T.LEVELED[name].from_torch(twin, "native")


@pytest.mark.parametrize("name,kinds", [("gpt", {"attention", "mlp", "layer_norm", "embedding"}),
                                        ("lstm", {"lstm", "embedding"}), ("cnn", {"conv_bn"})])
def test_every_layer_type_is_charged_and_the_shares_add_up(name, kinds):
    p, batches, model = _model(name)
    result = breakdown(model, model, batches[:4], T.loss_of, p["lr"])
    ms = result["ms_per_step"]
    assert kinds | {"optimizer step"} <= set(ms), sorted(ms)
    assert all(v >= 0 for v in ms.values()) and all(ms[k] > 0 for k in kinds)
    assert result["step_ms"] > 0
    # every layer's time lies inside the step: the named parts never add up to more than it
    named = sum(v for k, v in ms.items() if not k.startswith("other"))
    assert named <= result["step_ms"] * 1.001, (named, result["step_ms"])
    assert sum(result["fraction"].values()) == pytest.approx(1.0, abs=1e-6)


def test_hooks_are_removed_and_only_outermost_layers_are_scoped():
    p, batches, model = _model("gpt")
    before = {id(m): (len(m._forward_hooks), len(m._backward_hooks)) for m in model.modules()}
    breakdown(model, model, batches[:4], T.loss_of, p["lr"])
    after = {id(m): (len(m._forward_hooks), len(m._backward_hooks)) for m in model.modules()}
    assert before == after
    scoped = [m for _, m in _outermost(model)]
    for m in scoped:  # no scoped layer inside another: its time would count twice
        assert not any(s is not m and any(c is m for c in s.modules()) for s in scoped)


def test_too_few_batches_is_a_clear_error():
    p, batches, model = _model("lstm")
    with pytest.raises(ValueError, match="breakdown needs 4 batches"):
        breakdown(model, model, batches[:2], T.loss_of, p["lr"])


def test_train_reports_the_breakdown_per_run_even_after_two_steps():
    report = T.train("lstm", ("native",), ("torch",), "tiny", steps=2, device="cpu", breakdown=True)
    runs = {r["name"]: r for r in report["runs"]}
    assert report["settings"]["breakdown"] is True
    assert "lstm" in runs["native"]["breakdown"]["ms_per_step"]
    assert "lstm" in runs["torch"]["breakdown"]["ms_per_step"]  # nn.LSTM, the cuDNN baseline
    assert torch.isfinite(torch.tensor(runs["native"]["breakdown"]["step_ms"]))
