"""Level 2 (TorchScript): the harness passes, buffers behave like BatchNorm2d, the
deprecation warning is shown once, and a torch without scripting is reported, not crashed on."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import levels
from equivalence import cards
from equivalence.check import check
from levels import torchscript as ts


# every variant of every component, in both layouts
CASES = sum(len(cards.get(c).variants) for c in cards.names()) * len(cards.LAYOUTS)


def _failures(results):
    return [f"{r.component}/{r.variant} {r.dtype}: {r.status} {r.reason} worst={r.worst}"
            for r in results if not r.passed]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_harness_passes_all_components_forward_and_backward(dtype):
    # Three rounds with fresh seeds: the profiling executor runs the plain graph on the
    # first call of each specialization and the optimized graph afterwards; both are checked.
    for _ in range(3):
        results = check(level="torchscript", dtype=dtype, size="tiny")
        assert len(results) == CASES  # every variant of every component, both layouts
        assert not _failures(results), _failures(results)


def test_harness_passes_at_small_size():
    results = check(level="torchscript", dtype="float32", size="small")
    assert not _failures(results), _failures(results)


def _conv_bn_args(seed, training):
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(4, 3, 8, 8, generator=g),
                conv_weight=torch.randn(6, 3, 3, 3, generator=g) * 0.3,
                conv_bias=torch.randn(6, generator=g), bn_weight=torch.rand(6, generator=g) + 0.5,
                bn_bias=torch.randn(6, generator=g), running_mean=torch.randn(6, generator=g),
                running_var=torch.rand(6, generator=g) + 0.5, stride=1, padding=1,
                training=training)


def test_conv_bn_train_updates_running_stats_in_place_like_batchnorm2d():
    for seed in range(3):  # fresh buffers every call: nothing may be cached between calls
        a = _conv_bn_args(seed, training=True)
        rm, rv = a["running_mean"], a["running_var"]
        ref_rm, ref_rv = rm.clone(), rv.clone()
        out = ts.conv_bn(**a)
        y = F.conv2d(a["x"], a["conv_weight"], a["conv_bias"], padding=1)
        ref = F.batch_norm(y, ref_rm, ref_rv, a["bn_weight"], a["bn_bias"], training=True,
                           momentum=0.1)
        assert a["running_mean"] is rm and a["running_var"] is rv
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rm, ref_rm, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(rv, ref_rv, rtol=1e-6, atol=1e-6)


def test_conv_bn_eval_uses_the_statistics_of_each_call():
    # The BN fold happens per call: new running statistics must change the result at once.
    for seed in range(3):
        a = _conv_bn_args(seed, training=False)
        out = ts.conv_bn(**a)
        y = F.conv2d(a["x"], a["conv_weight"], a["conv_bias"], padding=1)
        ref = F.batch_norm(y, a["running_mean"], a["running_var"], a["bn_weight"], a["bn_bias"])
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    a = _conv_bn_args(0, training=False)
    before = ts.conv_bn(**a)
    a["running_mean"] += 1.0
    assert not torch.allclose(ts.conv_bn(**a), before)


def test_frozen_conv_bn_folds_batch_norm_into_the_conv_and_keeps_its_values():
    a = _conv_bn_args(7, training=False)
    scripted, frozen = ts.frozen_conv_bn(a["conv_weight"], a["conv_bias"], a["bn_weight"],
                                         a["bn_bias"], a["running_mean"], a["running_var"],
                                         stride=1, padding=1, return_unfrozen=True)
    kinds_after = {n.kind() for n in frozen.graph.nodes()}
    assert "aten::conv2d" in kinds_after and "aten::batch_norm" not in kinds_after
    assert "aten::batch_norm" in {n.kind() for n in scripted.inlined_graph.nodes()}
    with torch.no_grad():
        torch.testing.assert_close(frozen(a["x"]), ts.conv_bn(**a), rtol=1e-5, atol=1e-5)
        # Frozen means frozen: later changes to the statistics are not seen (the trade-off
        # that makes the level fold per call instead).
        old = frozen(a["x"])
        a["running_mean"] += 1.0
        torch.testing.assert_close(frozen(a["x"]), old)


def test_bad_input_fails_with_the_contract_error():
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    with pytest.raises(ValueError, match="layer_norm: argument 'weight'"):
        ts.layer_norm(x, w[:-1], b)
    with pytest.raises(TypeError, match="mlp: argument 'x'"):
        ts.mlp(x.long(), torch.randn(3, 8), torch.randn(3), torch.randn(2, 3), torch.randn(2))


def test_uses_tf32_is_honest():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not ts.uses_tf32("mlp", cpu, torch.float32)
    assert not ts.uses_tf32("layer_norm", cuda, torch.float32)  # no matmul at all
    assert not ts.uses_tf32("mlp", cuda, torch.bfloat16)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for flag in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = flag
            assert ts.uses_tf32("mlp", cuda, torch.float32) is flag
            assert ts.uses_tf32("attention", cuda, torch.float32) is flag
            assert ts.uses_tf32("swiglu_mlp", cuda, torch.float32) is flag
            # autocast casts rope's x to low precision like a matmul's, yet it makes none
            assert not ts.uses_tf32("rope", cuda, torch.float32)
            assert not ts.uses_tf32("rms_norm", cuda, torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture
def fresh_build(monkeypatch):
    """Forget the scripted functions (restored afterwards), as in a fresh process."""
    monkeypatch.setattr(ts, "_SCRIPTED", None)
    monkeypatch.setattr(ts, "_BUILD_ERROR", None)
    monkeypatch.setattr(ts, "_WARNED", False)


def test_deprecation_warning_is_shown_once_and_explained(fresh_build):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.randn(2, 5)
        for _ in range(3):
            ts.layer_norm(x, torch.ones(5), torch.zeros(5))
            ts.mlp(x, torch.randn(4, 5), torch.randn(4), torch.randn(3, 4), torch.randn(3))
        ts.frozen_conv_bn(torch.randn(2, 3, 1, 1), None, torch.ones(2), torch.zeros(2),
                          torch.zeros(2), torch.ones(2))  # script + freeze again: still quiet
    ours = [w for w in caught if issubclass(w.category, ts.TorchScriptDeprecationWarning)]
    raw = [w for w in caught if w.category is DeprecationWarning and "torch.jit" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert not raw, [str(w.message) for w in raw]
    message = str(ours[0].message)
    assert "deprecated" in message and "torch.export" in message and "Level 3" in message
    assert ours[0].filename == __file__  # it points at the caller's line, not our internals


def test_a_torch_without_scripting_makes_the_level_unavailable(fresh_build, monkeypatch):
    monkeypatch.delattr(torch.jit, "script")
    reason = ts.unavailable_reason(torch.device("cpu"))
    assert reason and "no torch.jit.script" in reason and "torch.compile" in reason
    assert levels.status("torchscript", "cpu", "mlp") == reason
    results = check("mlp", "torchscript", size="tiny")
    assert [r.status for r in results] == ["skip", "skip"]  # both layouts
    assert all("torch.jit.script" in r.reason for r in results)
    with pytest.raises(RuntimeError, match="unavailable"):
        ts.mlp(torch.randn(2, 3), torch.randn(4, 3), torch.randn(4), torch.randn(2, 4),
               torch.randn(2))


def test_a_failing_torch_jit_script_makes_the_level_unavailable(fresh_build, monkeypatch):
    def broken(obj, *args, **kwargs):
        raise RuntimeError("TorchScript support was removed")

    monkeypatch.setattr(torch.jit, "script", broken)
    reason = levels.status("torchscript", "cpu")
    assert reason and "TorchScript support was removed" in reason


def test_pytorch_jit_disabled_is_reported_not_silently_eager(fresh_build, monkeypatch):
    # With PYTORCH_JIT=0, torch.jit.script returns the Python function: Level 2 would be
    # Level 1 in disguise. The level must say so instead.
    monkeypatch.setattr(torch.jit._state._enabled, "enabled", False)
    reason = levels.status("torchscript", "cpu")
    assert reason and "PYTORCH_JIT=0" in reason
