"""levels.nn.cuda_graph: a levels.nn module's call captured as a CUDA graph and replayed.

On a CPU: the clear errors (a CPU module or input, level="auto", keyword arguments, bad
options), every per-call check of the arguments and of the module (levels.cuda_graph._Signature
needs no GPU), the `levels bench --overhead` graph rows (skipped, with the reason), and the
capture/replay wiring itself with a stand-in for the CUDA graph (`recorded_graphs` below:
it records the aten ops a capture would and replays them into the same tensors), so that
forward, gradients, `.grad` accumulation and the stale-backward check are exercised here.

On a GPU (`pytest -m gpu tests/test_nn_cuda_graph.py`): every component at levels native,
triton and cuda (where available), forward and gradients of the graph equal the same module
called directly, on two fresh inputs in turn; the errors again, with real captures.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import levels
from levels import cuda_graph as graphs
from levels import nn as lnn

NO_GPU = "CUDA graphs replay GPU work"
COMPONENTS = ["layer_norm", "mlp", "lstm", "attention", "conv_bn_train", "conv_bn_eval"]
GPU_LEVELS = ["native", "triton", "cuda"]


def _case(component: str, device="cpu", level="native", seed=0):
    """(module, make_args): a small levels.nn module and a function that draws fresh
    positional arguments for it (make_args(grad) makes the main input require grad; for the
    LSTM h0 too, so that a gradient inside the `hx` tuple is checked; c0 never)."""
    torch.manual_seed(seed)
    kw = {"device": device, "level": level}
    if component == "layer_norm":
        m = lnn.LayerNorm(129, **kw)
        with torch.no_grad():  # off the ones/zeros init: a dropped weight must show
            m.weight.normal_()
            m.bias.normal_()
        shape, extra = (2, 5, 129), ()
    elif component == "mlp":
        m, shape, extra = lnn.MLP(24, 72, 20, **kw), (2, 9, 24), ()
    elif component == "lstm":
        m, shape, extra = lnn.LSTM(12, 16, **kw), (3, 5, 12), ("hx",)
    elif component == "attention":
        # causal=True passed by position: forward(query, key=None, value=None, causal=False)
        m, shape, extra = lnn.MultiheadAttention(32, 2, **kw), (2, 37, 32), (None, None, True)
    else:
        m = lnn.ConvBN(3, 5, 3, stride=2, padding=1, **kw)
        with torch.no_grad():
            m.bn.running_mean.normal_()
            m.bn.running_var.uniform_(0.5, 2)
            m.bn.weight.normal_()
        m.train(component == "conv_bn_train")
        shape, extra = (2, 3, 9, 11), ()

    def make_args(grad: bool = False):
        x = torch.randn(shape, device=device).requires_grad_(grad)
        if extra == ("hx",):
            h0 = torch.randn(1, 3, 16, device=device).requires_grad_(grad)
            return x, (h0, torch.randn(1, 3, 16, device=device))
        return (x, *extra)

    return m, make_args


def _tensors(value) -> list:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _detached_copy(args):
    """The same arguments as new tensors (requires_grad kept): the reference's own."""
    return torch.utils._pytree.tree_map(
        lambda t: t.detach().clone().requires_grad_(t.requires_grad)
        if isinstance(t, torch.Tensor) else t, args)


def _close(got, want, what: str, bound: float = 1e-4) -> None:
    """Relative (norm-wise) agreement: the graph runs the same kernels as the direct call,
    so only reassociation (atomics, a library's other algorithm) may differ."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    got, want = got.detach().double(), want.detach().double()
    err, scale = float((got - want).norm()), float(want.norm())
    assert err <= bound * scale + 1e-6, f"{what}: |graph - direct| {err:.3g}, |direct| {scale:.3g}"


# ---------------------------------------------------------------------------------------
# CPU: the errors, and the per-call checks
# ---------------------------------------------------------------------------------------

def test_a_cpu_module_or_input_is_refused_with_what_to_do():
    m, make_args = _case("layer_norm")
    with pytest.raises(ValueError, match=f"argument 'x' is on cpu: {NO_GPU}.*call the module directly"):
        lnn.cuda_graph(m, *make_args())
    # the module's own tensors are checked too (here with no example argument at all)
    with pytest.raises(ValueError,
                       match=f"parameter 'weight' of argument 'module' is on cpu: {NO_GPU}"):
        lnn.cuda_graph(m)


def test_level_auto_is_refused_before_anything_runs():
    m, make_args = _case("mlp")
    m.level = "auto"
    with pytest.raises(ValueError, match=r"level='auto'.*pick a level first"):
        lnn.cuda_graph(m, *make_args())
    model = torch.nn.Sequential(lnn.LayerNorm(24), lnn.MLP(24, 48))
    lnn.set_level(model, "auto")
    with pytest.raises(ValueError,
                       match=r"argument 'module': Sequential.0, Sequential.1 are at level='auto'"):
        lnn.cuda_graph(model, torch.randn(2, 24))


def test_keyword_and_option_errors():
    m, make_args = _case("attention")
    x = make_args()[0]
    with pytest.raises(ValueError, match=r"argument 'causal'.*positionally.*None, None, True"):
        lnn.cuda_graph(m, x, causal=True)
    with pytest.raises(ValueError, match="argument 'warmup' must be an int >= 1"):
        lnn.cuda_graph(m, x, warmup=0)
    with pytest.raises(ValueError, match="argument 'backward' must be None"):
        lnn.cuda_graph(m, x, backward="yes")
    with pytest.raises(TypeError, match="argument 'module' must be a torch.nn.Module"):
        lnn.cuda_graph(lambda t: t, x)
    with pytest.raises(ValueError, match=r"argument 'key': a CUDA graph's arguments must be tensors"):
        lnn.cuda_graph(m, x, {"k": x})


def test_each_call_is_checked_against_the_capture_naming_the_argument():
    m, make_args = _case("attention")
    sig = graphs._Signature(m, make_args())
    assert len(sig.tensors(make_args())) == 1  # query; key/value None and causal are fixed
    x = make_args()[0]
    bad = {
        "shape (2, 38, 32)": (torch.randn(2, 38, 32), None, None, True),
        "dtype float64": (x.double(), None, None, True),
        "'causal' was True at capture; got False": (x, None, None, False),
        "'key' was None at capture; got": (x, x, None, True),
        "captured with 4 positional arguments": (x,),
        "'query' must be a tensor": (x.tolist(), None, None, True),
    }
    for expected, args in bad.items():
        with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            sig.tensors(args)
    # other strides are fine: a call's values are copied into the graph's own input
    assert sig.tensors((x.transpose(0, 1).contiguous().transpose(0, 1), None, None, True))
    err = sig.keyword_error({"causal": True})
    assert "'causal' is argument 3 of MultiheadAttention.forward" in str(err)

    lstm, make_lstm = _case("lstm")
    sig = graphs._Signature(lstm, make_lstm())
    assert sig.tensor_names == ["argument 'x'", "argument 'hx'[0]", "argument 'hx'[1]"]
    x, (h0, c0) = make_lstm()
    with pytest.raises(ValueError, match=r"argument 'hx' must be a tuple of 2 items.*got NoneType"):
        sig.tensors((x, None))
    with pytest.raises(ValueError,
                       match=r"argument 'hx'\[1\] must have the capture's shape \(1, 3, 16\)"):
        sig.tensors((x, (h0, c0[:, :2])))


def test_a_changed_module_is_refused():
    m, make_args = _case("conv_bn_train")
    sig = graphs._Signature(m, make_args())
    sig.check_module()
    m.level = "torchscript"
    with pytest.raises(RuntimeError,
                       match="captured at level 'native' and is now at level 'torchscript'"):
        sig.check_module()
    m.level = "native"
    m.eval()
    with pytest.raises(RuntimeError, match=r"ConvBN was captured in training mode.*call \.train\(\)"):
        sig.check_module()
    m.train()
    m.bn.running_mean = m.bn.running_mean.clone()
    with pytest.raises(RuntimeError, match="buffer 'bn.running_mean' was replaced or moved"):
        sig.check_module()
    m2, make_args2 = _case("mlp")
    sig = graphs._Signature(m2, make_args2())
    with torch.no_grad():
        m2.fc1.weight.add_(1)  # in place: what an optimizer does, fine
    sig.check_module()
    m2.fc1.weight.data = m2.fc1.weight.data.clone()
    with pytest.raises(RuntimeError, match="parameter 'fc1.weight' was replaced or moved"):
        sig.check_module()


def test_overhead_graph_rows_on_a_cpu_are_skipped_with_the_reason():
    from equivalence.commands.bench import overhead

    report = overhead.measure(["layer_norm"], ["native", "cuda"], "cpu", min_time_s=0.01)
    assert [(r["level"], r["status"]) for r in report["rows"]] == \
        [("eager", "ok"), ("native", "ok"), ("cuda", "skip")]  # as before: unchanged
    assert report["settings"]["graph_levels"] == ["native"]
    (row,) = report["graph_rows"]
    assert row["level"] == "native + CUDA graph" and row["graphed_level"] == "native"
    assert row["status"] == "skip" and row["reason"] == "CUDA graphs need a CUDA device"
    assert row["host_fwd_vs_level_us"] is None and row["host_fwd_vs_eager_us"] is None


# ---------------------------------------------------------------------------------------
# CPU: the capture and replay wiring, with a stand-in for the CUDA graph
# ---------------------------------------------------------------------------------------

class _Recorder(TorchDispatchMode):
    def __init__(self, tape):
        super().__init__()
        self.tape = tape

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.tape.append((func, args, kwargs, out))
        return out


class _RecordedGraph:
    """Stands in for torch.cuda.CUDAGraph: what runs inside `graph(...)` is recorded op by
    op (below autograd: the backward's ops too), and replay() runs the ops again into the
    same output tensors, reading whatever the captured input tensors hold now. Unlike a
    CUDA capture, recording also runs the ops once."""

    def __init__(self):
        self.tape = []

    def replay(self):
        with torch.no_grad():
            for func, args, kwargs, out in self.tape:
                new = func(*args, **kwargs)
                for old, fresh in zip(tree_leaves(out), tree_leaves(new)):
                    if isinstance(old, torch.Tensor) and old is not fresh:
                        old.copy_(fresh)


class _Stream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def recorded_graphs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _RecordedGraph)
    monkeypatch.setattr(torch.cuda, "graph", _recording)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(lnn.GraphedModule, "_device",
                        staticmethod(lambda module, sig: torch.device("cpu")))


@contextlib.contextmanager
def _recording(graph, pool=None):
    """Stands in for `torch.cuda.graph(graph, pool=...)`."""
    with _Recorder(graph.tape):
        yield


def _graph_matches_direct_calls(component, device, level, trials=2):
    """The graph (with its backward) against a copy of the module called directly, on
    `trials` fresh inputs in turn: outputs, gradients of the inputs and parameters, buffers."""
    m, make_args = _case(component, device, level)
    ref = copy.deepcopy(m)
    graphed = lnn.cuda_graph(m, *make_args(grad=True))
    assert graphed.backward and graphed.levels == {type(m).__name__: level}
    for name, value in ref.state_dict().items():  # the warm-up calls' updates were undone
        _close(m.state_dict()[name], value, f"{name} after capture")
    firsts = None
    for trial in range(trials):
        args = make_args(grad=True)
        args_ref = _detached_copy(args)
        outs = _tensors(graphed(*args))
        upstream = [torch.randn_like(o) for o in outs]
        wrt = [t for t in _tensors(args) if t.requires_grad] + list(m.parameters())
        grads = torch.autograd.grad(outs, wrt, upstream)
        outs = [o.clone() for o in outs]  # the graph's own memory: the next call overwrites it
        outs_ref = _tensors(ref(*args_ref))
        wrt_ref = [t for t in _tensors(args_ref) if t.requires_grad] + list(ref.parameters())
        grads_ref = torch.autograd.grad(outs_ref, wrt_ref, upstream)
        for i, (a, b) in enumerate(zip(outs, outs_ref)):
            _close(a, b, f"{component} at {level}, call {trial}: output {i}")
        names = [f"input {i}" for i in range(len(wrt) - len(list(m.parameters())))] + \
            [n for n, _ in m.named_parameters()]
        for name, a, b in zip(names, grads, grads_ref):
            _close(a, b, f"{component} at {level}, call {trial}: gradient of {name}")
        for name, value in ref.state_dict().items():
            _close(m.state_dict()[name], value, f"{component} at {level}, call {trial}: {name}")
        if firsts is None:
            firsts = outs
        else:  # the replay read the new input, not the capture's or the last call's
            assert not torch.equal(firsts[0], outs[0])
    return m, ref, graphed, make_args


def _grad_accumulates_as_direct_calls(m, ref, graphed, make_args):
    """.grad over two backward passes (pytorch/pytorch#181723: never the graph's buffers)."""
    for p in [*m.parameters(), *ref.parameters()]:
        p.grad = None
    for _ in range(2):
        args = make_args()
        sum(o.float().sum() for o in _tensors(graphed(*args))).backward()
        sum(o.float().sum() for o in _tensors(ref(*_detached_copy(args)))).backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        _close(p.grad, q.grad, f".grad of {name} after two backward passes")


@pytest.mark.parametrize("component", COMPONENTS)
def test_replay_wiring_forward_backward_and_grad_accumulation(recorded_graphs, component):
    m, ref, graphed, make_args = _graph_matches_direct_calls(component, "cpu", "native", trials=3)
    _grad_accumulates_as_direct_calls(m, ref, graphed, make_args)
    with torch.no_grad():  # the same graph without autograd: the forward replayed alone
        args = make_args()
        for a, b in zip(_tensors(graphed(*args)), _tensors(ref(*_detached_copy(args)))):
            _close(a, b, "under no_grad")


def test_replay_wiring_refuses_what_would_be_silently_wrong(recorded_graphs):
    m, make_args = _case("mlp")
    graphed = lnn.cuda_graph(m, *make_args())
    a, b = make_args(), make_args()
    y1 = graphed(*a)
    y2 = graphed(*b)
    assert torch.equal(y1, y2)  # documented: outputs are the graph's memory, overwritten
    with pytest.raises(RuntimeError, match="after the graph was replayed again"):
        y1.sum().backward()
    y = graphed(*a)
    torch.autograd.grad(y.sum(), list(m.parameters()), retain_graph=True)
    with pytest.raises(RuntimeError, match="a second backward through one graphed call"):
        y.sum().backward()
    y3 = graphed(*a)
    y3.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place before its backward"):
        y3.sum().backward()
    kept = lnn.cuda_graph(m, *make_args(), clone_outputs=True)
    y1 = kept(*a)
    kept(*b)
    _close(y1, m(*a), "clone_outputs=True keeps each call's output")
    m.level = "torchscript"
    with pytest.raises(RuntimeError, match="captured at level 'native'"):
        graphed(*a)
    m.level = "native"
    with pytest.raises(ValueError, match=r"argument 'x' must have the capture's shape \(2, 9, 24\)"):
        graphed(torch.randn(2, 8, 24))
    with pytest.raises(ValueError, match="positionally"):
        graphed(x=a[0])

    with torch.no_grad():
        forward_only = lnn.cuda_graph(m, *make_args())
    assert not forward_only.backward
    with pytest.raises(RuntimeError, match="holds the forward only"):
        forward_only(*a)  # grad on and the parameters require it: no silent missing gradient
    lstm, make_lstm = _case("lstm")
    x, hx = make_lstm()
    graphed = lnn.cuda_graph(lstm, x.requires_grad_(), hx)  # h0 does not require grad here
    with pytest.raises(RuntimeError,
                       match=r"argument 'hx'\[0\] requires grad, but its example did not"):
        graphed(*make_lstm(grad=True))


# ---------------------------------------------------------------------------------------
# GPU: real captures
# ---------------------------------------------------------------------------------------

def _available(level: str, component: str) -> None:
    reason = levels.status(level, "cuda", component.split("_train")[0].split("_eval")[0])
    if reason:
        pytest.skip(f"level {level}: {reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("level", GPU_LEVELS)
@pytest.mark.parametrize("component", COMPONENTS)
def test_graph_equals_the_module_called_directly(component, level):
    _available(level, component)
    m, ref, graphed, make_args = _graph_matches_direct_calls(component, "cuda", level)
    _grad_accumulates_as_direct_calls(m, ref, graphed, make_args)


@pytest.mark.gpu
@pytest.mark.parametrize("level", GPU_LEVELS)
@pytest.mark.parametrize("component", COMPONENTS)
def test_forward_only_graph_under_no_grad(component, level):
    _available(level, component)
    m, make_args = _case(component, "cuda", level)
    ref = copy.deepcopy(m)
    with torch.no_grad():
        graphed = lnn.cuda_graph(m, *make_args())
        assert not graphed.backward
        kept = []
        for trial in range(2):
            args = make_args()
            outs = _tensors(graphed(*args))
            for i, (a, b) in enumerate(zip(outs, _tensors(ref(*_detached_copy(args))))):
                _close(a, b, f"{component} at {level}, call {trial}: output {i}")
            kept.append(outs[0])
        # documented: the outputs are the graph's own memory, overwritten by the next call
        assert kept[0].data_ptr() == kept[1].data_ptr() and torch.equal(kept[0], kept[1])
        for name, value in ref.state_dict().items():
            _close(m.state_dict()[name], value, f"{component} at {level}: {name}")
    with pytest.raises(RuntimeError, match="holds the forward only"):
        graphed(*make_args())


@pytest.mark.gpu
@pytest.mark.parametrize("level", ["native", "triton"])
def test_gpu_errors_after_a_real_capture(level):
    _available(level, "mlp")
    m, make_args = _case("mlp", "cuda", level)
    graphed = lnn.cuda_graph(m, *make_args())
    graphed(*make_args())
    with pytest.raises(ValueError, match=r"argument 'x' must have the capture's shape \(2, 9, 24\)"):
        graphed(torch.randn(2, 10, 24, device="cuda"))
    with pytest.raises(ValueError, match="dtype float64"):
        graphed(torch.randn(2, 9, 24, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="on cpu"):
        graphed(torch.randn(2, 9, 24))
    m.level = "torchscript"
    with pytest.raises(RuntimeError,
                       match=f"captured at level '{level}' and is now at level 'torchscript'"):
        graphed(*make_args())
    m.level = level
    y = graphed(*make_args())
    graphed(*make_args())
    with pytest.raises(RuntimeError, match="after the graph was replayed again"):
        y.sum().backward()
    with pytest.raises(ValueError, match=r"argument 'x' is on cpu: CUDA graphs replay GPU work"):
        lnn.cuda_graph(m, torch.randn(2, 9, 24))
    auto = copy.deepcopy(m)
    auto.level = "auto"
    with pytest.raises(ValueError, match="level='auto'"):
        lnn.cuda_graph(auto, *make_args())


@pytest.mark.gpu
def test_overhead_graph_rows_on_a_gpu():
    from equivalence.commands.bench import overhead

    report = overhead.measure(["layer_norm"], ["native", "triton"], "cuda", min_time_s=0.05)
    rows = {r["graphed_level"]: r for r in report["graph_rows"]}
    assert set(rows) == {"native", "triton"}
    for name, row in rows.items():
        if levels.status(name, "cuda", "layer_norm"):
            assert row["status"] == "skip"
            continue
        assert row["status"] == "ok", f"{name}: {row['reason']}"
        assert row["host_fwd"]["median_ms"] > 0 and row["host_fwd_bwd"]["median_ms"] > 0
        assert row["capture_fwd_ms"] > 0 and row["host_fwd_vs_level_us"] is not None
