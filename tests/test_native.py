"""Level 1 passes the harness: every component, forward and backward, fp32 and bf16, CPU."""

import pytest

from equivalence import cards
from equivalence.check import check
from levels.contract import COMPONENTS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("component", COMPONENTS)
def test_native_passes(component, dtype):
    results = check(component, "native", dtype, "cpu", "tiny")
    assert len(results) == len(cards.get(component).variants) * len(cards.LAYOUTS)
    for r in results:
        assert r.status == "pass", (r.variant, r.reason, r.comparisons)
        # outputs, updated buffers and every gradient were all compared
        n_grads = len(cards.get(component).differentiable)
        assert len(r.comparisons) >= 1 + n_grads


@pytest.mark.parametrize("component", ["attention", "conv_bn"])
def test_native_passes_small_fp16(component):
    for r in check(component, "native", "float16", "cpu", "small"):
        assert r.status == "pass", (r.variant, r.reason, r.worst)
