"""Validating once per argument signature (levels.contract.Plans) refuses every bad input of
the catalogue as validating every call does: the same exception, the same message, on a
table that a good call of the same component has warmed, and again on the next call.

Two tables are tried for every row: the contract's validator alone behind a Plans table
(every component; what any level that caches its verdicts gets), and the table Level 4
really calls through on this machine (levels.triton: the contract and its own checks)."""

from __future__ import annotations

import inspect

import levels  # noqa: F401 - first: it switches Triton's interpreter on where there is no GPU

import pytest
import torch

from levels import contract
from levels.contract import VALIDATORS, Plans, conv_bn_buffers, signature

from tests.test_bad_inputs import CATALOGUE, COMPUTE, SIZES, TYPE_ERROR, VALUE_ERROR, Bad

ERRORS = (VALUE_ERROR, TYPE_ERROR)


def _positional(fn, args: dict) -> tuple:
    """args (by name) as fn's positional arguments, defaults filled in."""
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        out.append(args[name] if name in args else p.default)
    return tuple(out)


def _good(bad: Bad) -> dict:
    from equivalence import cards as specs
    spec = specs.get(bad.component)
    variant = bad.variant or next(iter(spec.variants))
    size = SIZES[bad.component] if bad.size is None else bad.size
    return dict(spec.case(size, variant, bad.dtype, torch.device("cpu"), seed=0).args)


def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return type(exc).__name__, str(exc)
    return None


def _cold_and_warm(table: Plans, fn, bad: Bad) -> tuple:
    bad_args = _positional(fn, bad.args("cpu"))
    table.clear()
    cold = _raised(lambda: table(*bad_args))
    table.clear()
    good = _positional(fn, _good(bad))
    assert _raised(lambda: table(*good)) is None, "the good call was refused"
    assert len(table) == 1, "the good call's verdict was not kept"
    warm = _raised(lambda: table(*bad_args))
    again = _raised(lambda: table(*bad_args))
    return cold, warm, again


def _rows(level: str | None):
    for bad in CATALOGUE:
        if "cpu" not in bad.devices or bad.isolate or bad.shapes_only:
            continue
        expected = bad.expect if level is None or not bad.tried(level, "cpu") else bad.expectation(level)
        if level is None and not bad.by_contract:
            continue
        if any(e in ERRORS for e in expected.split("|")):
            yield pytest.param(bad, id=bad.key)


@pytest.mark.parametrize("bad", list(_rows(None)))
def test_the_contracts_verdicts_kept_per_signature_refuse_every_bad_input(bad):
    validator = VALIDATORS[bad.component]
    table = Plans(validator, extra=conv_bn_buffers if bad.component == "conv_bn" else None)
    cold, warm, again = _cold_and_warm(table, validator, bad)
    assert cold is not None and cold[0] in bad.expect.split("|"), cold
    assert warm == cold and again == cold


@pytest.mark.parametrize("bad", list(_rows("triton")))
def test_level_4s_table_refuses_every_bad_input_it_refuses_cold(bad):
    import levels.triton as L4
    if L4.unavailable_reason(torch.device("cpu"), bad.component):
        pytest.skip(L4.unavailable_reason(torch.device("cpu"), bad.component))
    table = getattr(L4, f"_{bad.component.upper()}")
    fn = getattr(L4, bad.component)
    cold, warm, again = _cold_and_warm(table, fn, bad)
    table.clear()
    allowed = bad.expectation("triton").split("|")
    # (a row may allow either: float64 is refused compiled and computed in the interpreter)
    assert (cold[0] in allowed) if cold is not None else (COMPUTE in allowed), cold
    assert warm == cold and again == cold


def test_a_signature_holds_everything_a_validator_reads():
    x = torch.randn(4, 6)
    w, b = torch.randn(6), torch.randn(6)
    base = signature((x, w, b, 1e-5))
    assert base == signature((torch.randn(4, 6), w, b, 1e-5))  # values are not read
    for other in ((x.t().contiguous().t(), w, b, 1e-5),   # strides
                  (x[:, :5], w[:5], b[:5], 1e-5),        # shapes
                  (x.double(), w, b, 1e-5),              # dtype
                  (x.requires_grad_(False).clone().requires_grad_(), w, b, 1e-5),  # grad
                  (torch.randn(7)[1:].view(1, 6).expand(4, 6), w, b, 1e-5),  # misaligned, stride 0
                  (x, w, b, 1e-6), (x, w, b, 1)):          # scalar value and type
        assert signature(other) != base
    # Not cached at all: while tracing, tensor subclasses, and non-scalar arguments.
    assert signature((torch.nn.Parameter(w), [1, 2])) is None
    assert signature((torch.randn(2).as_subclass(_Sub),)) is None


class _Sub(torch.Tensor):
    pass


def test_the_table_starts_over_past_its_limit():
    calls = []
    table = Plans(lambda x, n: calls.append(n) or n, limit=3)
    for n in range(7):
        table(torch.zeros(1), n)
    assert len(table) <= 3 and calls == list(range(7))
    table(torch.zeros(1), 6)
    assert calls == list(range(7))  # kept: not validated again


def test_training_buffers_key_on_their_addresses_and_inference_mode():
    # the contract's aliasing check reads addresses: a new buffer that overlaps an argument
    # must be refused although the shapes are those of a kept good call
    from equivalence import cards as specs
    args = dict(specs.get("conv_bn").case("tiny", "train", torch.float32, "cpu", seed=0).args)
    validator = VALIDATORS["conv_bn"]
    table = Plans(validator, extra=conv_bn_buffers)
    table(*_positional(validator, args))
    aliased = dict(args, running_mean=args["bn_bias"])
    with pytest.raises(ValueError, match="sharing no memory with 'bn_bias'"):
        table(*_positional(validator, aliased))
    with torch.inference_mode():
        frozen = args["running_var"].clone()
    with pytest.raises(ValueError, match="inference mode"):
        table(*_positional(validator, dict(args, running_var=frozen)))
    assert contract.conv_bn_buffers(*_positional(validator, dict(args, training=False))) is None


def test_training_buffers_key_only_the_addresses_that_could_overlap_them():
    # x is new memory every step, and under autocast so is the cast weight: the table must
    # serve them without validating again, yet still refuse an x laid over a running
    # statistic, with a signature the table has already seen good
    from equivalence import cards as specs
    args = dict(specs.get("conv_bn").case("tiny", "train", torch.float32, "cpu", seed=0).args)
    validator = VALIDATORS["conv_bn"]
    builds = []
    table = Plans(lambda *a: builds.append(1) or validator(*a), extra=conv_bn_buffers)
    steps = [dict(args, x=args["x"].clone(), conv_weight=args["conv_weight"].clone())
             for _ in range(3)]  # all alive: three addresses each
    for fresh in steps:
        table(*_positional(validator, fresh))
    assert len(builds) == 1
    x, mean = args["x"], args["running_mean"]
    shift = 4 * ((mean.numel() + 3) // 4)  # whole 16-byte words: both x's keep one alignment
    store = torch.randn(x.numel() + shift)
    buffers = dict(running_mean=store[:mean.numel()])
    apart = store[shift:].view(x.shape)
    over = store[:x.numel()].view(x.shape)
    table(*_positional(validator, dict(args, x=apart, **buffers)))  # same storage, no overlap
    assert len(builds) == 2
    with pytest.raises(ValueError, match="sharing no memory with 'x'"):
        table(*_positional(validator, dict(args, x=over, **buffers)))
    with pytest.raises(ValueError, match="sharing no memory with 'x'"):  # and again: not kept
        table(*_positional(validator, dict(args, x=over, **buffers)))


# ---------------------------------------------------------------------------------------
# One call reads each tensor's part of the signature once (contract.one_call)
# ---------------------------------------------------------------------------------------

def test_one_call_reads_each_tensor_once_and_forgets_after_the_call():
    x, w = torch.randn(3, 4), torch.nn.Parameter(torch.randn(4))
    seen = []

    @contract.one_call
    def level_call(*args):
        seen.append(contract._CALL.memo is not None)
        first = signature(args)
        # within the call the same tensors give the same key, from the table: a part computed
        # outside would differ here (requires_grad flipped below the table's back)
        was = x.requires_grad
        x.requires_grad_(not was)
        second = signature(args)
        x.requires_grad_(was)
        return first, second

    first, second = level_call(x, w, 1e-5)
    assert seen == [True] and first == second and contract._CALL.memo is None
    # a later call reads every tensor afresh: metadata may change between calls
    x.requires_grad_(True)
    again, _ = level_call(x, w, 1e-5)
    assert again != first and again[0][4] is True
    assert signature((x, w, 1e-5)) == again  # outside a call: no table, the same key


def test_one_call_tables_are_per_thread_and_nested_calls_share_the_outer():
    import threading

    inner_memo = []

    @contract.one_call
    def inner():
        inner_memo.append(contract._CALL.memo)

    @contract.one_call
    def outer():
        memo = contract._CALL.memo
        inner()
        other = []
        t = threading.Thread(target=lambda: other.append(contract._CALL.memo))
        t.start()
        t.join()
        return memo, other[0]

    memo, in_other_thread = outer()
    assert inner_memo == [memo] and memo is not None and in_other_thread is None
    assert contract._CALL.memo is None


def test_level4_functions_share_one_table_per_call():
    import levels.triton as L4

    for name in contract.COMPONENTS:
        fn, found = getattr(L4, name), False
        while fn is not None and not found:
            found = fn.__code__ is contract.one_call(lambda: None).__code__
            fn = getattr(fn, "__wrapped__", None)
        assert found, f"levels.triton.{name} is not wrapped in contract.one_call"
