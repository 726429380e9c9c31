"""`explain`: what each level really runs, in text that belongs to the component."""

import types

import pytest

import levels
from equivalence import explain as explain_module
from equivalence.explain import Explanation, explain
from levels import torchscript as ts

# Ops that only the named component's code could produce, per level's vocabulary.
EXPECTED = {
    "native": {
        "attention": ["aten.bmm", "aten._softmax", "aten.masked_fill"],
        "layer_norm": ["aten.mean", "aten.rsqrt"],
        "mlp": ["aten.addmm", "aten.gelu", "aten.gelu_backward"],
        "lstm": ["aten.sigmoid", "aten.tanh", "aten.stack", "aten.sigmoid_backward"],
        "conv_bn": ["aten.convolution", "aten.var", "aten.add_", "aten.convolution_backward"],
    },
    "torchscript": {
        "attention": ["aten::softmax", "aten::masked_fill", "aten::matmul"],
        "layer_norm": ["aten::rsqrt", "aten::mean"],
        "mlp": ["aten::erf", "aten::matmul"],
        "lstm": ["prim::Loop", "aten::sigmoid", "aten::tanh"],
        "conv_bn": ["aten::conv2d", "aten::rsqrt", "aten::add_", "torch.jit.freeze"],
    },
    "compile": {
        "attention": ["scaled_dot_product", "cpp_fused__softmax"],
        "layer_norm": ["cpp_fused", "rsqrt"],
        "mlp": ["extern_kernels.addmm", "erf"],
        "lstm": ["sigmoid", "tanh", "extern_kernels.mm"],
        "conv_bn": ["convolution", "rsqrt"],
    },
}


@pytest.mark.parametrize("level", ["native", "torchscript", "compile"])
@pytest.mark.parametrize("component", sorted(EXPECTED["native"]))
def test_explain_shows_the_components_own_ops(component, level):
    text = explain(component, level)
    assert isinstance(text, str) and isinstance(text, Explanation)
    assert component in text.splitlines()[1]
    missing = [op for op in EXPECTED[level][component] if op not in text]
    assert not missing, f"{component}/{level}: {missing} not in:\n{text[:3000]}"
    # Nothing of another component's signature ops leaks in (e.g. a wrong function run).
    if component != "lstm":
        assert "sigmoid" not in text
    if component not in ("mlp",):
        assert "erf(" not in text and "aten::erf" not in text and "aten.gelu" not in text


def test_native_counts_ops_and_marks_views():
    text = explain("layer_norm", "native")
    body = text.section("forward")
    assert "2  aten.mean" in body  # two reductions: mean and variance
    assert "ATen ops" in body
    assert "(view: no kernel)" in explain("lstm", "native").section("forward")


def test_torchscript_explains_fusion_on_this_device():
    text = explain("lstm", "torchscript")
    summary = text.section("forward: optimized graph summary")
    assert "fusion groups:" in summary and "loops kept in the graph (prim::Loop):" in summary
    if "fusion groups: 0" in summary:  # a CPU without LLVM: the reason is given
        assert "LLVM" in summary


def test_torchscript_conv_bn_shows_the_freeze_fold():
    text = explain("conv_bn", "torchscript", variant="eval")
    fold = text.section("torch.jit.freeze")
    assert "after torch.jit.freeze: aten ops aten::conv2d\n" in fold
    assert "aten::batch_norm" in fold.split("after torch.jit.freeze")[0]


def test_compile_shows_the_sdpa_rewrite_and_the_code_without_it():
    text = explain("attention", "compile", variant="full")
    assert "replaced matmul -> scale -> softmax -> matmul" in text
    assert "SDPA rewrite off" in text and "cpp_fused__softmax" in text
    assert "C++/OpenMP" in text


def test_explain_of_an_unavailable_level_gives_the_reason(monkeypatch):
    monkeypatch.setattr(ts, "_SCRIPTED", None)
    monkeypatch.setattr(ts, "_BUILD_ERROR", None)
    monkeypatch.delattr(ts.torch.jit, "script")
    text = explain("mlp", "torchscript")
    assert "cannot run mlp" in text and "no torch.jit.script" in text


def test_other_levels_use_their_own_explain_or_say_there_is_none(monkeypatch):
    fake = types.SimpleNamespace(explain=lambda component, device: f"kernel source for {component}")
    monkeypatch.setattr(levels, "status", lambda level, device="cpu", component=None: None)
    monkeypatch.setattr(levels, "get", lambda level: fake)
    assert "kernel source for mlp" in explain("mlp", "triton")
    monkeypatch.setattr(levels, "get", lambda level: types.SimpleNamespace())
    assert "has no explain yet" in explain("mlp", "cuda")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="argument 'component'"):
        explain("softmax", "native")
    with pytest.raises(ValueError, match="argument 'level'"):
        explain("mlp", "level9")
    with pytest.raises(ValueError, match="argument 'variant'"):
        explain("mlp", "native", variant="causal")
    with pytest.raises(ValueError, match="argument 'device'"):
        explain("mlp", "native", device="gpu0")


def test_notebook_display_is_the_text():
    text = explain("mlp", "native")
    printed = []
    text._repr_pretty_(types.SimpleNamespace(text=printed.append), cycle=False)
    assert printed == [str(text)]
    assert explain_module.RULE in printed[0]
