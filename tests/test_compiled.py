"""Level 3 (torch.compile): the harness passes, settings are documented and checked, buffers
behave like BatchNorm2d, and the SDPA rewrite of attention is real and can be switched off.

Compiling is the expensive part (seconds per graph on a 2-core CPU): every test here uses
`tiny` inputs, and the settings are restored after each test that changes them, so each
graph is compiled once per process (Inductor's on-disk cache makes reruns faster)."""

import os

import pytest
import torch
import torch.nn.functional as F

from equivalence import cards
from equivalence.check import check
from equivalence.commands.explain import inductor_code
from levels import compiled


@pytest.fixture
def restore_settings():
    saved = dict(compiled._settings)
    yield
    compiled.configure(mode=saved["mode"] or "auto", dynamic=saved["dynamic"],
                       sdpa_rewrite=saved["sdpa_rewrite"])


# every variant of every component, in both layouts
CASES = sum(len(cards.get(c).variants) for c in cards.names()) * len(cards.LAYOUTS)


def _failures(results):
    return [f"{r.component}/{r.variant} {r.dtype}: {r.status} {r.reason} worst={r.worst}"
            for r in results if not r.passed]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harness_passes_all_components_forward_and_backward(dtype):
    results = check(level="compile", dtype=dtype, size="tiny")
    assert len(results) == CASES  # every variant of every component x 2 layouts
    assert not _failures(results), _failures(results)
    # A second round with fresh inputs runs the cached graphs (no recompilation).
    results = check(level="compile", dtype=dtype, size="tiny")
    assert not _failures(results), _failures(results)


ENV_OVERRIDES = any(os.environ.get(v) for v in ("LEVELS_COMPILE_MODE", "LEVELS_COMPILE_DYNAMIC"))


@pytest.mark.skipif(ENV_OVERRIDES, reason="the environment overrides the defaults")
def test_default_settings_are_the_documented_ones():
    assert compiled.settings("cpu") == {"mode": "default", "dynamic": False, "sdpa_rewrite": True}
    assert compiled.settings("cuda")["mode"] == "default"  # max-autotune: minutes, an option
    assert compiled.compile_kwargs("cpu") == {"fullgraph": True, "dynamic": False,
                                              "mode": "default"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message of a machine without CUDA")
def test_cuda_without_a_gpu_is_reported():
    assert "no CUDA device" in compiled.unavailable_reason(torch.device("cuda"))


def test_configure_validates_and_applies(restore_settings):
    with pytest.raises(ValueError, match="argument 'mode' must be 'auto' or one of"):
        compiled.configure(mode="fastest")
    with pytest.raises(ValueError, match="reduce-overhead"):
        compiled.configure(mode="reduce-overhead")
    with pytest.raises(TypeError, match="argument 'dynamic'"):
        compiled.configure(dynamic="yes")
    s = compiled.configure(mode="max-autotune-no-cudagraphs", dynamic=True)
    assert s["mode"] == "max-autotune-no-cudagraphs" and s["dynamic"] is True
    assert compiled.settings("cpu")["mode"] == "max-autotune-no-cudagraphs"
    off = compiled.compile_kwargs("cpu", sdpa_rewrite=False)
    # torch.compile accepts a mode or options, not both: the mode becomes options.
    assert "mode" not in off and off["options"]["pattern_matcher"] is False
    assert off["options"]["max_autotune"] is True and off["dynamic"] is True


def test_env_flag_parsing(monkeypatch):
    monkeypatch.setenv("LEVELS_COMPILE_DYNAMIC", "1")
    assert compiled._env_flag("LEVELS_COMPILE_DYNAMIC") is True
    monkeypatch.setenv("LEVELS_COMPILE_DYNAMIC", "maybe")
    with pytest.raises(ValueError, match="LEVELS_COMPILE_DYNAMIC"):
        compiled._env_flag("LEVELS_COMPILE_DYNAMIC")


def test_dynamic_shapes_serve_several_sizes_correctly(restore_settings):
    compiled.configure(dynamic=True)
    for rows in (3, 5, 8):
        x, w, b = torch.randn(rows, 33), torch.randn(33), torch.randn(33)
        torch.testing.assert_close(compiled.layer_norm(x, w, b), F.layer_norm(x, (33,), w, b),
                                   rtol=1e-5, atol=1e-5)


def test_conv_bn_train_updates_running_stats_in_place_like_batchnorm2d():
    for seed in range(2):  # fresh buffers every call: the compiled graph must write into them
        g = torch.Generator().manual_seed(seed)
        x, w = torch.randn(4, 3, 8, 8, generator=g), torch.randn(6, 3, 3, 3, generator=g) * 0.3
        cb, bb = torch.randn(6, generator=g), torch.randn(6, generator=g)
        bw = torch.rand(6, generator=g) + 0.5
        rm, rv = torch.randn(6, generator=g), torch.rand(6, generator=g) + 0.5
        ref_rm, ref_rv = rm.clone(), rv.clone()
        out = compiled.conv_bn(x, w, cb, bw, bb, rm, rv, stride=1, padding=1, training=True)
        ref = F.batch_norm(F.conv2d(x, w, cb, padding=1), ref_rm, ref_rv, bw, bb, training=True)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rm, ref_rm, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(rv, ref_rv, rtol=1e-6, atol=1e-6)


def test_recompile_limit_leaves_room_for_every_specialization():
    compiled.compiled("layer_norm", "cpu")
    assert torch._dynamo.config.recompile_limit >= compiled.RECOMPILE_LIMIT


def test_bad_input_fails_with_the_contract_error_before_compiling():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="attention: argument 'k'"):  # 3 K/V heads for 2
        compiled.attention(q, torch.randn(1, 3, 6, 8), torch.randn(1, 3, 6, 8), causal=True)


def test_uses_tf32_is_honest():
    assert not compiled.uses_tf32("mlp", torch.device("cpu"), torch.float32)
    assert not compiled.uses_tf32("layer_norm", torch.device("cuda"), torch.float32)
    assert compiled.uses_tf32("conv_bn", torch.device("cuda"), torch.float32) is \
        torch.backends.cudnn.allow_tf32


def test_attention_is_rewritten_into_sdpa_and_the_rewrite_can_be_switched_off():
    case = cards.get("attention").case("tiny", "full", torch.float32, "cpu", seed=0)
    with_rewrite = inductor_code("attention", case, "cpu")
    assert len(with_rewrite) == 2  # forward and backward graphs
    assert all("scaled_dot_product" in code for code in with_rewrite)
    without = inductor_code("attention", case, "cpu", sdpa_rewrite=False)
    assert not any("scaled_dot_product" in code for code in without)
    assert "softmax" in without[0] and "bmm" in without[0]  # Inductor's own kernel + 2 GEMMs


def test_configured_level_without_sdpa_rewrite_still_passes(restore_settings):
    compiled.configure(sdpa_rewrite=False)
    results = check("attention", "compile", dtype="float32", size="tiny", variant="full")
    assert not _failures(results), _failures(results)
