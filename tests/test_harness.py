"""The harness's own parts: seeding, poisoning, timing, profiling, agreement."""

import pytest
import torch

import levels.native as native
from equivalence import cards
from equivalence.commands.agree import REFERENCE, agreement
from equivalence.check import check, poisoned_allocations
from equivalence.profile import NEVER, SAME, Profile, break_even_calls, profile, speedup_spread
from equivalence.timing import time_first_call, time_fn


def test_inputs_are_fresh_random_and_replayable():
    spec = cards.get("mlp")
    a = spec.case("tiny", "default", torch.float32, "cpu", seed=1).args["x"]
    b = spec.case("tiny", "default", torch.float32, "cpu", seed=2).args["x"]
    c = spec.case("tiny", "default", torch.float32, "cpu", seed=1).args["x"]
    assert not torch.equal(a, b) and torch.equal(a, c)
    assert a.abs().min() > 0 or (a != 0).float().mean() > 0.99  # never zeros
    seeds = {check("layer_norm", "native")[0].seed for _ in range(3)}
    assert len(seeds) == 3  # a new seed for every check


def test_poisoning_fills_new_allocations_with_nan():
    with poisoned_allocations():
        t = torch.empty(1000)
    assert torch.isnan(t).all()
    before = torch.are_deterministic_algorithms_enabled()
    with poisoned_allocations():
        pass
    assert torch.are_deterministic_algorithms_enabled() == before  # state restored


def test_time_fn_reports_median_and_spread():
    x = torch.randn(256, 256)
    t = time_fn(lambda: x @ x, "cpu", min_time_s=0.05)
    assert t.runs >= 1 and 0 < t.p20_ms <= t.median_ms * 1.5 and t.p80_ms >= t.p20_ms
    assert time_first_call(lambda: x @ x, "cpu") > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_time_fn_primed_queue_excludes_the_cpu():
    # 300 tiny launches: the CPU needs far longer to enqueue them than the GPU to run them,
    # so the end-to-end figure is the CPU's pace and the primed one only the kernels'.
    x = torch.randn(64, device="cuda")

    def launches():
        for _ in range(300):
            x.add_(1e-6)

    plain = time_fn(launches, "cuda", min_time_s=0.05)
    primed = time_fn(launches, "cuda", min_time_s=0.05, prime=True)
    assert "primed" in primed.method and "primed" not in plain.method
    assert plain.cpu_enqueue_ms > 0
    assert primed.median_ms < 0.9 * plain.median_ms, (primed, plain)


def test_profile_skips_with_reason_and_times_native():
    p = profile("mlp", "cuda", size="tiny")
    assert p.status == "skip" and "needs a CUDA GPU" in p.reason
    p = profile("layer_norm", "native", size="tiny", min_time_s=0.01)
    assert p.status == "ok" and p.fwd["median_ms"] > 0 and p.fwd_bwd["median_ms"] > 0
    assert p.throughput("fwd")["tbps"] > 0 and p.flops["fwd"] > 0


def _p(first, steady, spread=None):
    timing = {"median_ms": steady}
    if spread:
        timing.update(p20_ms=spread[0], p80_ms=spread[1])
    return Profile("mlp", "x", "default", "float32", "cpu", "tiny", {}, "ok", first_call_ms=first,
                   fwd_bwd=timing)


def test_break_even_calls():
    native_p = _p(1.0, 1.0)
    # 101 + (n-1)*0.5 <= n*1.0  <=>  n >= 201
    assert break_even_calls(_p(101.0, 0.5), native_p) == 201
    assert break_even_calls(_p(0.5, 0.5), native_p) == 1
    assert break_even_calls(_p(50.0, 2.0), native_p) == NEVER  # slower: never pays off


def test_break_even_never_for_a_slower_level_with_a_cheap_first_call():
    # measured once: torchscript's first call (65 ms) was under native's steady time (85 ms), but
    # its steady state is slower (105 ms): it was reported as paying off after 1 call
    assert break_even_calls(_p(65.4, 105.0), _p(98.9, 85.2)) == NEVER
    assert break_even_calls(_p(0.5, 1.0), _p(1.0, 1.0)) == NEVER  # as fast is not faster


def test_break_even_is_a_count_only_when_the_spreads_do_not_overlap():
    # measured twice from the same code: 16 calls, then never; the intervals overlapped
    native_p = _p(1.0, 1.0, (0.9, 1.2))
    assert break_even_calls(_p(20.0, 0.95, (0.85, 1.1)), native_p) == SAME
    assert break_even_calls(_p(20.0, 1.05, (0.95, 1.3)), native_p) == SAME
    assert break_even_calls(_p(20.0, 0.5, (0.45, 0.6)), native_p) == 39  # clear of it: a count
    assert break_even_calls(_p(20.0, 2.0, (1.8, 2.2)), native_p) == NEVER
    low, mid, high = speedup_spread(_p(20.0, 0.95, (0.85, 1.1)), native_p)
    assert low == pytest.approx(0.9 / 1.1) and mid == pytest.approx(1 / 0.95) and high == pytest.approx(1.2 / 0.85)


def test_break_even_unknown_when_either_was_not_timed():
    untimed = _p(None, None)
    untimed.status = "untimed"
    assert break_even_calls(untimed, _p(1.0, 1.0)) is None
    assert break_even_calls(_p(1.0, 0.5), untimed) is None


def test_agreement_matrix_shows_a_disagreeing_level(monkeypatch):
    a = agreement("layer_norm", level_names=["native", "cuda"])
    assert a.names == [REFERENCE, "native"] and "cuda" in a.skipped
    assert a.matrix[0][0] == 0 and a.matrix[0][1] < 1e-5
    original = native.layer_norm
    monkeypatch.setattr(native, "layer_norm", lambda x, weight, bias, eps=1e-5: original(x, weight, bias, 1e-1))
    a = agreement("layer_norm", level_names=["native"])
    assert a.matrix[0][1] > 1e-3


def test_spec_rejects_unknown_size_and_variant():
    with pytest.raises(ValueError, match="argument 'size'"):
        cards.get("lstm").case("huge", "default", torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="argument 'variant'"):
        cards.get("attention").case("tiny", "sliding", torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="argument 'component'"):
        cards.get("softmax")


def test_check_args_takes_your_own_arguments():
    from equivalence.check import check_args
    args = cards.get("attention").case("tiny", "causal", torch.float32, "cpu", seed=3).args
    args["q"] = args["q"].transpose(1, 2).contiguous().transpose(1, 2)  # a strided view
    r = check_args("attention", "native", args)
    assert r.passed and r.variant == "causal" and r.size == "custom", r.summary()
    r = check_args("conv_bn", "native", cards.get("conv_bn").case(
        dict(N=2, C_in=3, H=5, W=4, C_out=2, k=1, stride=1, padding=0), "train", torch.float32, "cpu", 1).args
        | {"conv_bias": None})
    assert r.passed and "grad conv_bias" not in str(r.comparisons), r.summary()


def test_exactly_zero_gradients_are_measured_against_their_natural_scale(monkeypatch):
    # Width-1 layernorm: the output is `bias` whatever x is, grad x is exactly 0. A level's
    # rounding-sized grad x passes; a real one (here: forgetting the mean) fails.
    r = check("layer_norm", "native", size=dict(rows=(33,), N=1))[0]
    assert r.passed and any("grad x (exactly 0)" == c.name for c in r.comparisons), r.summary()
    monkeypatch.setattr(native, "layer_norm", lambda x, weight, bias, eps=1e-5:
                        x * weight / (1 + eps) ** 0.5 + bias)
    r = check("layer_norm", "native", size=dict(rows=(33,), N=1))[0]
    assert not r.passed and "grad x (exactly 0)" in r.summary()
