"""triton_kernels/replay.py + replay.cpp: Level 4's calls recorded once, replayed from C++.

On a CPU the kernels run in Triton's interpreter, which the replay never takes; what is
tested here is everything else, for real: the dry pass of Level 4's own Functions, the
plan (where each pointer points, each scalar's bytes), the C++ library built with g++,
and its replay in "fake" mode, where each launch is logged instead of run: the log must
hold the pointers of the replay's own tensors (inputs, the buffers it allocated, the saved
ones in the backward, the gradients it returns) and the recorded scalars. Fills, which
the replay does run, are checked by value. Refusals name what could not be replayed.

On a GPU (`-m gpu`): every component's call, replayed, gives bit for bit what the Python
path gives, forward and backward, at every variant of its card.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

import levels  # noqa: F401 - switches Triton's interpreter on where there is no GPU
import levels.triton as level4
from levels.contract import signature
from triton_kernels import launch as L
from triton_kernels import replay as R

R.install(signature)  # what levels.triton does when it loads its first kernels

_FUNCTIONS: dict = {}
COMPONENTS = ("layer_norm", "rms_norm", "attention", "mlp", "swiglu_mlp", "rope", "conv_bn", "lstm")


def _fake_compiled(kernel, grid, args, kwargs):
    """A stand-in for Triton's CompiledKernel, typed as Triton would type the arguments."""
    params = inspect.signature(kernel.fn).parameters  # the interpreter's kernels: no .params
    names = list(params)
    values = dict(zip(names, args))
    values.update(kwargs)
    signature = {}
    for name, p in params.items():
        v = values.get(name, None if p.default is inspect.Parameter.empty else p.default)
        if "constexpr" in str(p.annotation) or v is None:
            signature[name] = "constexpr"
        elif isinstance(v, torch.Tensor):
            signature[name] = "*fp32"
        elif isinstance(v, bool):
            signature[name] = "i1"
        elif isinstance(v, int):
            signature[name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
        else:
            signature[name] = "fp32"
    function = _FUNCTIONS.setdefault(kernel.fn.__name__, 0x1000 + len(_FUNCTIONS))
    ck = types.SimpleNamespace(
        function=function, metadata=types.SimpleNamespace(num_warps=kwargs.get("num_warps", 4),
                                                          shared=0),
        src=types.SimpleNamespace(fn=types.SimpleNamespace(arg_names=names), signature=signature,
                                  constants={}))
    return ck, names[:len(args)]


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    """The library, built with g++ (once per process: replay._build never loads twice), in
    a directory of the test's unless LEVELS_CUDA_CACHE names one."""
    import os

    saved = os.environ.get("LEVELS_CUDA_CACHE")
    os.environ.setdefault("LEVELS_CUDA_CACHE", str(tmp_path_factory.mktemp("cache")))
    try:
        return R._build()
    finally:
        if saved is None:
            os.environ.pop("LEVELS_CUDA_CACHE")


def _launches(log: list) -> list[dict]:
    out, i = [], 0
    while i < len(log):
        n = log[i + 6]
        out.append({"function": log[i], "grid": tuple(log[i + 1:i + 4]), "threads": log[i + 4],
                    "params": log[i + 7:i + 7 + n]})
        i += 7 + n
    return out


def _scalars_and_pointers(event):
    """(kernel, [(name, value)]) of a recorded launch's non-constexpr arguments."""
    _, kernel, grid, args, kwargs = event
    kernel = L.jit_of(kernel)
    params = inspect.signature(kernel.fn).parameters
    names = list(params)
    constexpr = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
    pairs = [(n, a) for n, a in zip(names, args) if n not in constexpr and a is not None]
    return kernel, grid, pairs


def test_layer_norm_replays_its_recorded_launches_with_its_own_buffers(ops):
    from triton_kernels.layer_norm import _LayerNorm

    x = torch.randn(4, 37, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    b = torch.randn(64, requires_grad=True)
    args = (x, w, b, 1e-5, None, None)
    rec = R._record(_LayerNorm, args)
    assert not rec.refused
    launches = [e for e in rec.events if e[0] == "launch"]
    assert rec.boundary == 1 and len(launches) == 3  # forward; backward and the column sums
    plan = ops.add_plan(R.plan_words(rec, compiled=_fake_compiled), True)
    ops.take_fake_log()

    y = ops.replay.default(plan, [x, w, b])[0]
    assert y.shape == x.shape and y.dtype == x.dtype and y.grad_fn is not None
    assert not y._is_view()  # a buffer of its own, as the Python path's y: in-place ops work
    (fwd,) = _launches(ops.take_fake_log())
    kernel, grid, pairs = _scalars_and_pointers(launches[0])
    assert fwd["function"] == _FUNCTIONS[kernel.fn.__name__]
    assert fwd["grid"] == tuple(grid) + (1,) * (3 - len(grid))
    by_name = dict(zip([n for n, _ in pairs], fwd["params"]))
    assert by_name["x_ptr"] == x.data_ptr() and by_name["y_ptr"] == y.data_ptr()
    assert by_name["w_ptr"] == w.data_ptr() and by_name["b_ptr"] == b.data_ptr()
    for name, value in pairs:
        if not isinstance(value, torch.Tensor) and isinstance(value, int):
            assert by_name[name] == value, name
    stats = by_name["stats_ptr"]
    assert stats not in (x.data_ptr(), y.data_ptr())

    g = torch.randn_like(y)
    y.backward(g)
    bwd, sums = _launches(ops.take_fake_log())
    _, _, bwd_pairs = _scalars_and_pointers(launches[1])
    bwd_by_name = dict(zip([n for n, _ in bwd_pairs], bwd["params"]))
    assert bwd_by_name["dy_ptr"] == g.data_ptr()  # the gradient as given: no copy
    assert bwd_by_name["x_ptr"] == x.data_ptr()  # the saved input
    assert bwd_by_name["stats_ptr"] == stats  # the forward's buffer, kept by the node
    assert bwd_by_name["dx_ptr"] == x.grad.data_ptr()
    _, _, sum_pairs = _scalars_and_pointers(launches[2])
    sums_by_name = dict(zip([n for n, _ in sum_pairs], sums["params"]))
    assert sums_by_name["part_ptr"] == bwd_by_name["part_ptr"]
    assert sums_by_name["out_ptr"] == w.grad.data_ptr()
    assert b.grad.data_ptr() == w.grad.data_ptr() + 64 * 4  # dbias: the second half
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape


def test_a_gradient_in_another_layout_is_copied_into_the_recorded_one(ops):
    from triton_kernels.layer_norm import _LayerNorm

    x = torch.randn(6, 32, requires_grad=True)
    w, b = torch.randn(32), torch.randn(32)
    plan = ops.add_plan(R.plan_words(R._record(_LayerNorm, (x, w, b, 1e-5, None, None)),
                                     compiled=_fake_compiled), True)
    y = ops.replay.default(plan, [x, w, b])[0]
    ops.take_fake_log()
    g = torch.randn(32, 6).t()  # the right shape, transposed strides
    y.backward(g)
    bwd = _launches(ops.take_fake_log())[0]
    assert g.data_ptr() not in bwd["params"]


def test_a_strided_view_is_read_where_it_starts_and_with_its_strides(ops):
    from triton_kernels.layer_norm import _LayerNorm

    base = torch.randn(9, 50)
    x = base[1:7, 3:35].requires_grad_()  # rows 50 apart, starting 53 elements in
    w, b = torch.randn(32), torch.randn(32)
    rec = R._record(_LayerNorm, (x, w, b, 1e-5, None, None))
    plan = ops.add_plan(R.plan_words(rec, compiled=_fake_compiled), True)
    ops.take_fake_log()
    other = torch.randn(9, 50)[1:7, 3:35]  # the same signature, another address
    ops.replay.default(plan, [other, w, b])
    (fwd,) = _launches(ops.take_fake_log())
    _, _, pairs = _scalars_and_pointers([e for e in rec.events if e[0] == "launch"][0])
    by_name = dict(zip([n for n, _ in pairs], fwd["params"]))
    assert by_name["x_ptr"] == other.data_ptr() and by_name["stride_xm"] == 50


class _Fills(torch.autograd.Function):
    """No kernel: the forward returns zeros, the backward 2s (fills the replay runs)."""

    @staticmethod
    def forward(ctx, x):
        return x.new_zeros(x.shape)

    @staticmethod
    def backward(ctx, g):
        return g.new_full(g.shape, 2.0)


def test_fills_are_replayed_by_value_into_fresh_buffers(ops):
    x = torch.randn(5, 7, requires_grad=True)
    plan = ops.add_plan(R.plan_words(R._record(_Fills, (x,)), compiled=_fake_compiled), True)
    y = ops.replay.default(plan, [x])[0]
    assert torch.equal(y, torch.zeros(5, 7))
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((5, 7), 2.0))


class _TwoOutputs(torch.autograd.Function):
    """No kernel: two outputs shaped like x (1s and 2s, fills); the backward returns a copy
    of the second output's gradient (what a replay can run)."""

    @staticmethod
    def forward(ctx, x):
        return x.new_full(x.shape, 1.0), x.new_full(x.shape, 2.0)

    @staticmethod
    def backward(ctx, g1, g2):
        out = g1.new_empty(g1.shape)
        out.copy_(g2)  # a replayed copy: the second gradient, as autograd hands it over
        return out


def test_an_unused_output_gets_a_zero_gradient_as_autograd_function_gives(ops):
    x = torch.randn(3, 5, requires_grad=True)
    plan = ops.add_plan(R.plan_words(R._record(_TwoOutputs, (x,)), compiled=_fake_compiled), True)
    a, b = ops.replay.default(plan, [x])
    assert torch.equal(a, torch.ones(3, 5)) and torch.equal(b, torch.full((3, 5), 2.0))
    a.sum().backward()  # b unused: its gradient is materialized as zeros
    assert torch.equal(x.grad, torch.zeros(3, 5))
    x.grad = None
    a2, b2 = ops.replay.default(plan, [x])
    (b2 * 7).sum().backward()
    assert torch.equal(x.grad, torch.full((3, 5), 7.0))


class _Sums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum(0)

    @staticmethod
    def backward(ctx, g):
        return g.expand(3, -1).clone()


class _FillsInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.zero_()
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize("function, why", [(_Sums, "aten.sum"),
                                           (_FillsInput, "zero_ writes into an input")])
def test_what_a_replay_cannot_reproduce_is_refused_with_the_reason(function, why):
    x = torch.randn(3, 4)
    kept = x.clone()
    with pytest.raises(R.Refused, match=why):
        R.plan_words(R._record(function, (x,)), compiled=_fake_compiled)
    assert torch.equal(x, kept)  # the dry pass wrote nothing into the caller's tensor


class _Copies(torch.autograd.Function):
    """No kernel: the forward returns x transposed into a new buffer, the backward g's
    transpose, a 3-by-7 slice of a bigger buffer (copies the replay runs)."""

    @staticmethod
    def forward(ctx, x):
        return x.t().contiguous()

    @staticmethod
    def backward(ctx, g):
        big = g.new_zeros(4, 8)
        big[:3, :7].copy_(g.t())
        return big[:3, :7]


def test_copies_are_replayed_by_value(ops):
    x = torch.randn(3, 7, requires_grad=True)
    plan = ops.add_plan(R.plan_words(R._record(_Copies, (x,)), compiled=_fake_compiled), True)
    y = ops.replay.default(plan, [x])[0]
    assert torch.equal(y, x.detach().t())
    g = torch.randn(7, 3)
    y.backward(g)
    assert torch.equal(x.grad, g.t())


def _function_call(component, variant, monkeypatch, training=True):
    """(Function, args) of Level 4's call at the card's tiny case: what apply_ahead receives;
    training=False: (forward function, args), what forward_ahead receives."""
    from equivalence import cards
    from equivalence.calls import own_args

    args = cards.get(component).case("tiny", variant, torch.float32, torch.device("cpu"), 0).args
    seen = []

    def spy(function, a):
        seen.append((function, a))
        raise _Stop

    monkeypatch.setattr(L, "INTERPRETED", False)  # let apply_ahead ask the replay
    monkeypatch.setattr(R, "call" if training else "call_forward", spy)
    with pytest.raises(_Stop):
        getattr(level4, component)(**own_args(args, component, training=training))
    monkeypatch.undo()
    return seen[0]


class _Stop(Exception):
    pass


def _component_variants(components=COMPONENTS):
    from equivalence import cards

    return [(c, v) for c in components for v in cards.get(c).variants]


def _picked(plan, args, rec):
    """The tensors the table's entry hands the replay (by position, R._Served): every tensor
    argument, in order, the same objects as testing each argument would find."""
    entry = R._Served.of(plan, args, rec.single)
    tensors = entry[1](args)
    assert [id(t) for t in tensors] == [id(a) for a in args if isinstance(a, torch.Tensor)]
    return tensors


@pytest.mark.parametrize("component, variant", _component_variants())
def test_every_level4_function_plans_and_its_forward_replays(ops, component, variant, monkeypatch):
    function, args = _function_call(component, variant, monkeypatch)
    rec = R._record(function, args)
    plan = ops.add_plan(R.plan_words(rec, compiled=_fake_compiled), True)
    ops.take_fake_log()
    tensors = _picked(plan, args, rec)
    outs = ops.replay.default(plan, tensors)
    launches = [e for e in rec.events[:rec.boundary] if e[0] == "launch"]
    assert len(_launches(ops.take_fake_log())) == len(launches) >= 1
    assert [o.shape for o in outs] == [o.shape for o in rec.outs]


@pytest.mark.parametrize("component, variant", _component_variants(COMPONENTS + ("newton_schulz",)))
def test_every_level4_inference_forward_plans_and_replays(ops, component, variant, monkeypatch):
    fn, args = _function_call(component, variant, monkeypatch, training=False)
    rec = R._record_forward(fn, args)
    words = R.plan_words(rec, compiled=_fake_compiled)
    plan = ops.add_plan(words, True)
    ops.take_fake_log()
    outs = ops.replay_forward.default(plan, _picked(plan, args, rec))
    launches = [e for e in rec.events if e[0] == "launch"]
    assert len(_launches(ops.take_fake_log())) == len(launches) >= 1
    assert [o.shape for o in outs] == [o.shape for o in rec.outs]
    assert not any(o.requires_grad for o in outs)


def test_describe_names_where_each_pointer_points():
    from triton_kernels.layer_norm import _LayerNorm

    x = torch.randn(6, 32, requires_grad=True)
    w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    text = R.describe(_LayerNorm, (x, w, b, 1e-5, None, None))
    forward, backward = text.split("backward:")
    assert "x_ptr=x," in forward and "y_ptr=fwd_buffer" in forward and "M=6" in forward
    assert "x_ptr=saved x" in backward and "dy_ptr=grad_output0" in backward
    stats = forward.split("stats_ptr=")[1].split(",")[0]
    assert f"stats_ptr=saved {stats}" in backward  # the forward's statistics, kept by the node
    assert R.describe(_Sums, (torch.randn(3, 4),)).startswith("stays on the Python path")


def test_cpu_tensors_never_record_nor_build_the_library(monkeypatch):
    """Tests that stand CPU tensors in for the GPU (INTERPRETED patched off, as
    tests/test_compile_ahead.py does) take the Python path: no dry pass, no library."""
    recorded = []
    monkeypatch.setattr(L, "INTERPRETED", False)
    monkeypatch.setattr(R, "_record", lambda *a: recorded.append(a))
    x = torch.randn(4, requires_grad=True)
    assert R.call(_Fills, (x,)) is None and R.call_forward(_Fills.forward, (None, x)) is None
    assert not recorded


def test_empty_tensors_stay_on_the_python_path():
    x = torch.randn(0, 4, requires_grad=True)
    with pytest.raises(R.Refused, match="empty tensor"):
        R.plan_words(R._record(_Fills, (x,)), compiled=_fake_compiled)


def test_the_interpreter_never_replays_and_says_why():
    assert L.INTERPRETED  # no GPU here
    assert "interpreter" in R.unavailable()
    x = torch.randn(4, 8, requires_grad=True)
    w, b = torch.ones(8, requires_grad=True), torch.zeros(8, requires_grad=True)
    level4.layer_norm(x, w, b).sum().backward()
    assert R.stats() == {"replayed": 0, "python": 0}
    assert L._replay is R and R._signature is signature  # installed by levels.triton


# ---------------------------------------------------------------------------------------
# GPU: replayed calls give the Python path's bits
# ---------------------------------------------------------------------------------------



def _flatten(out) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    return [out]


def _run(component, args, grads_seed):
    from equivalence import cards
    from equivalence.calls import own_args, upstream

    fn = getattr(level4, component)
    mine = own_args(args, component, training=True)
    outs = _flatten(fn(**mine))  # the LSTM's (out, (h_n, c_n))
    leaves = [mine[k] for k in cards.get(component).differentiable if mine.get(k) is not None]
    grads = torch.autograd.grad(outs, leaves, upstream(outs, grads_seed), allow_unused=True)
    buffers = [v for k, v in mine.items() if isinstance(v, torch.Tensor) and not v.requires_grad]
    return [o.detach() for o in outs], list(grads), buffers


def _flat(result):
    return result[0] + result[1] + result[2]


def _same(want, again, got, what):
    """got == want bit for bit, where the Python path repeats itself bit for bit (want ==
    again); where it does not (atomics in a reduction), got within twice its own spread."""
    for a, a2, b in zip(_flat(want), _flat(again), _flat(got)):
        if a is None or b is None:
            assert a is None and b is None, what
        elif torch.equal(a, a2):
            assert torch.equal(a, b), what
        else:
            spread = (a.float() - a2.float()).abs().max().item()
            assert (a.float() - b.float()).abs().max().item() <= 2 * spread, what


@pytest.mark.gpu
@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_replayed_calls_give_the_python_paths_bits(component, dtype, monkeypatch):
    from equivalence import cards

    assert R.load() is not None, R.unavailable()
    python_calls = []
    apply_python = L.apply_python

    def counted(function, args):
        python_calls.append(function.__name__)
        return apply_python(function, args)

    monkeypatch.setattr(L, "apply_python", counted)
    card = cards.get(component)
    for size in ("tiny", "small"):
        for variant in card.variants:
            what = f"{component} {size} {variant} {dtype}"
            args = card.case(size, variant, dtype, torch.device("cuda"), 0).args
            monkeypatch.setattr(R, "ENABLED", False)
            want, again = _run(component, args, 1), _run(component, args, 1)
            monkeypatch.setattr(R, "ENABLED", True)
            _run(component, args, 1)  # the signature's first call: recorded, then planned
            python_calls.clear()
            got = _run(component, args, 1)
            # every component, the persistent LSTM included (its barrier report is an input)
            assert not python_calls, f"{what}: not replayed: {R.reasons()}"
            _same(want, again, got, what)
            _check_inference(component, args, what, monkeypatch)


def _check_inference(component, args, what, monkeypatch):
    """The call computing no gradient: its forward alone, replayed without a node, gives
    the Python path's bits."""
    monkeypatch.setattr(R, "ENABLED", False)
    want, again = _inference(component, args), _inference(component, args)
    monkeypatch.setattr(R, "ENABLED", True)
    _inference(component, args)  # the signature's first call: recorded, then planned
    replays = []
    call_forward = R.call_forward

    def noted(fn, a):
        out = call_forward(fn, a)
        replays.append(out is not None)
        return out

    monkeypatch.setattr(R, "call_forward", noted)
    got = _inference(component, args)
    monkeypatch.setattr(R, "call_forward", call_forward)
    assert replays == [True], f"{what} (no grad): not replayed: {R.reasons()}"
    _same(want, again, got, what + " (no grad)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_replayed_forward_only_components_give_the_python_paths_bits(dtype, monkeypatch):
    """newton_schulz has no backward: its whole call is one forward, replayed."""
    from equivalence import cards

    assert R.load() is not None, R.unavailable()
    card = cards.get("newton_schulz")
    for size in ("tiny", "small"):
        for variant in card.variants:
            args = card.case(size, variant, dtype, torch.device("cuda"), 0).args
            _check_inference("newton_schulz", args, f"newton_schulz {size} {variant} {dtype}",
                             monkeypatch)


def _inference(component, args):
    from equivalence.calls import own_args

    mine = own_args(args, component, training=False)
    with torch.no_grad():
        outs = _flatten(getattr(level4, component)(**mine))
    buffers = [v for v in mine.values() if isinstance(v, torch.Tensor)]
    return [o.clone() for o in outs], [], buffers


# A fresh process: the first call of each signature is never differentiated, and the next,
# replayed, call's outputs go straight to autograd.grad. Its backward is then the first CUDA
# work of the autograd engine's thread, where nothing has bound the device's context yet
# (torch's and Triton's launches would have: the runtime binds it, the driver API does not).
_FRESH_THREAD = """
import sys
import torch
import levels.triton as level4
from equivalence import cards
from equivalence.calls import own_args
from tests.test_replay import L, R, _run, _same

component = sys.argv[1]
card = cards.get(component)
args = card.case("tiny", next(iter(card.variants)), torch.float32, torch.device("cuda"), 0).args
python_calls = []
apply_python = L.apply_python
L.apply_python = lambda function, a: python_calls.append(1) or apply_python(function, a)
getattr(level4, component)(**own_args(args, component, training=True))  # recorded, no backward
python_calls.clear()
got = _run(component, args, 1)  # replayed; its outputs go straight to autograd.grad
torch.cuda.synchronize()
assert not python_calls, f"not replayed: {R.reasons()}"
R.ENABLED = False
want, again = _run(component, args, 1), _run(component, args, 1)
_same(want, again, got, component)
print("ok")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("component", COMPONENTS)
def test_gpu_a_replayed_backward_runs_on_the_engines_fresh_thread(component):
    import subprocess
    import sys
    from pathlib import Path

    assert R.load() is not None, R.unavailable()
    done = subprocess.run([sys.executable, "-c", _FRESH_THREAD, component], capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), \
        f"exit {done.returncode}:\n{done.stderr[-4000:]}"
