"""CUDA-graph capture of a fixed-shape module: `levels.nn.cuda_graph(module, *example_args)`.

It captures a module's call (forward, and backward when something requires grad) as a CUDA
graph and returns a module that replays it. What it buys: a replay is one graph launch, where
a call otherwise pays the host for its Python, the contract's validation, autograd and one
launch per kernel (tens to hundreds of microseconds at Level 4 on a small problem, more than
the GPU's own time). What it costs: the shapes, dtypes and device are fixed at capture (a
different one is refused: capture another graph); capture takes warm-up calls and
milliseconds; the graph keeps its own memory pool for its inputs, intermediates and outputs;
the outputs are that memory, overwritten by the next call (`clone_outputs=True` copies them
instead); and nothing on the host runs at replay — the validation, the level's Python and any
printing ran once, at capture. The level is fixed too: changing it afterwards, or capturing
`level="auto"`, is refused. (A whole training step, optimizer included, is captured by
`levels train --cuda-graph`: equivalence/commands/steps.py.)
"""

from __future__ import annotations

import inspect
import sys

import torch
from torch import nn

from . import AUTO


# ---------------------------------------------------------------------------------------
# CUDA-graph capture of a fixed-shape module (host time per call at small shapes)
# ---------------------------------------------------------------------------------------
#
# Built on torch.cuda.CUDAGraph directly, following torch.cuda.make_graphed_callables
# (warm-up on a side stream, forward captured, then backward captured into the same memory
# pool, one autograd.Function replaying both), rather than calling it, because as of
# torch 2.13 make_graphed_callables:
#   - patches `module.forward` in place (your own module then replays the graph, and quietly
#     runs eagerly instead when its train/eval mode differs from the capture's);
#   - copies whatever tensor a call passes into the captured input (copy_ broadcasts and
#     casts: a smaller or differently typed input would be silently wrong) and takes tensors
#     only (no `hx=None`, no `causal=True`);
#   - returns the parameters' gradients as its static buffers, which AccumulateGrad may adopt
#     as `.grad`: accumulating over two backward passes then gives a wrong sum
#     (pytorch/pytorch#181723);
#   - cannot tell that a backward runs after a later replay overwrote its activations.
# Here the module is left alone; every call's arguments are checked against the capture's;
# gradients are returned as fresh tensors; a stale backward raises.

_NO_CUDA = ("CUDA graphs replay GPU work; move the module and inputs to a CUDA device, or call "
            "the module directly")
_AGAIN = "capture another graph (levels.nn.cuda_graph(module, *args)) or call the module directly"
_TENSOR = "tensor"  # the spec of a tensor leaf
_CONSTANT_TYPES = (bool, int, float, str, type(None))


class _Const:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Seq:
    __slots__ = ("items", "kind")

    def __init__(self, kind, items):
        self.kind, self.items = kind, items


def _spec(value, where: str, tensors: list, names: list, what: str = "argument"):
    """The structure of `value` (tensors, tuples/lists of them, constants): tensors are
    appended to `tensors` (and where they sit to `names`), everything else is fixed."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        names.append(where)
        return _TENSOR
    if isinstance(value, (tuple, list)):
        return _Seq(type(value), tuple(_spec(v, f"{where}[{i}]", tensors, names, what)
                                       for i, v in enumerate(value)))
    if isinstance(value, _CONSTANT_TYPES):
        return _Const(value)
    raise ValueError(f"{where}: a CUDA graph's {what}s must be tensors, tuples or lists of them, "
                     f"or constants (None, bool, int, float, str); got {type(value).__name__}")


def _collect(spec, value, out: list) -> bool:
    """Appends a call's tensors to `out`; False where its structure or a constant differs
    from the capture's (then _mismatch says where and how)."""
    if spec is _TENSOR:
        if isinstance(value, torch.Tensor):
            out.append(value)
            return True
        return False
    if type(spec) is _Const:
        c = spec.value
        return value is c or (type(value) is type(c) and value == c)
    if type(value) is not spec.kind or len(value) != len(spec.items):
        return False
    for s, v in zip(spec.items, value):
        if not _collect(s, v, out):
            return False
    return True


def _mismatch(spec, value, where: str) -> str | None:
    if spec is _TENSOR:
        if isinstance(value, torch.Tensor):
            return None
        return f"{where} must be a tensor, as at capture; got {type(value).__name__}"
    if type(spec) is _Const:
        c = spec.value
        if value is c or (type(value) is type(c) and value == c):
            return None
        return (f"{where} was {c!r} at capture; got {value!r}: a graph replays the work its "
                f"capture's constants chose, so {_AGAIN}")
    if type(value) is not spec.kind or len(value) != len(spec.items):
        got = f"{type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) \
            else type(value).__name__
        return (f"{where} must be a {spec.kind.__name__} of {len(spec.items)} items, as at "
                f"capture; got {got}")
    for i, (s, v) in enumerate(zip(spec.items, value)):
        why = _mismatch(s, v, f"{where}[{i}]")
        if why:
            return why
    return None


def _build(spec, tensors):
    if spec is _TENSOR:
        return next(tensors)
    if type(spec) is _Const:
        return spec.value
    items = [_build(s, tensors) for s in spec.items]
    return spec.kind(*items) if hasattr(spec.kind, "_fields") else spec.kind(items)


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {str(t.dtype).replace('torch.', '')}, on {t.device}"


class _Signature:
    """What a capture fixes, checked on every call: the arguments (their structure, the
    constants, each tensor's shape, dtype and device) and the module (every submodule's
    train/eval mode and levels.nn level; each parameter and buffer still the tensor, at the
    address, the graph reads). No GPU needed: built and checked on a CPU too."""

    def __init__(self, module: nn.Module, args: tuple):
        try:
            params = list(inspect.signature(module.forward).parameters.values())
        except (TypeError, ValueError):
            params = []
        self.arg_names = []
        for p in params:
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                break
            self.arg_names.append(p.name)
        self.owner = type(module).__name__
        tensors, self.tensor_names = [], []
        self.specs = tuple(_spec(a, self._where(i), tensors, self.tensor_names)
                           for i, a in enumerate(args))
        self.examples = tensors
        self.flat = all(s is _TENSOR for s in self.specs)
        self.metas = [(t.shape, t.dtype, t.device) for t in tensors]
        # every submodule's mode, and each levels.nn layer's level
        # a levels.nn layer keeps its level in `_level` (duck-typed: levels.nn imports this module)
        self.modes = [(name, m, m.training, getattr(m, "_level", None))
                      for name, m in module.named_modules()]
        self.levels = {f"{self.owner}.{name}" if name else self.owner: level
                       for name, _, _, level in self.modes if level is not None}
        auto = [name for name, level in self.levels.items() if level == AUTO]
        if auto:
            raise ValueError(
                f"argument 'module': {', '.join(auto)} {'is' if len(auto) == 1 else 'are'} at "
                f"level='auto', which may pick another level on any call, while a CUDA graph "
                f"holds one level's kernels: pick a level "
                f"first (layer.level = 'triton', or levels.nn.set_level(module, 'triton')); "
                f"`levels select` shows what auto would pick")
        self.state = []  # (table, key, tensor, address, qualified name, kind)
        for prefix, m in module.named_modules():
            for kind, table in (("parameter", m._parameters), ("buffer", m._buffers)):
                for key, t in table.items():
                    if t is not None:
                        name = f"{prefix}.{key}" if prefix else key
                        self.state.append((table, key, t, t.data_ptr(), name, kind))

    def _where(self, i: int) -> str:
        return f"argument '{self.arg_names[i]}'" if i < len(self.arg_names) else f"argument {i}"

    def tensors(self, args: tuple) -> list | tuple:
        """A call's tensors, in the capture's order; ValueError naming the argument where the
        call differs from the capture."""
        ok = len(args) == len(self.specs)
        if ok and self.flat:  # tensors only (the common case): no structure to walk
            out = args
            for t in args:
                if not isinstance(t, torch.Tensor):
                    ok = False
                    break
        elif ok:
            out = []
            for s, a in zip(self.specs, args):
                if not _collect(s, a, out):
                    ok = False
                    break
        if ok:
            for t, (shape, dtype, device) in zip(out, self.metas):
                if t.shape != shape or t.dtype is not dtype or t.device != device:
                    ok = False
                    break
        if not ok:
            raise ValueError(self.explain(args))
        return out

    def explain(self, args: tuple) -> str:
        """Why the call `args` does not fit this capture (the slow path of `tensors`)."""
        head = f"levels.nn.cuda_graph ({self.owner}): "
        if len(args) != len(self.specs):
            names = ", ".join(self._where(i).replace("argument ", "") for i in range(len(self.specs)))
            return (f"{head}the graph was captured with {len(self.specs)} positional arguments "
                    f"({names}); got {len(args)}: pass the same arguments in the same order")
        for i, (s, a) in enumerate(zip(self.specs, args)):
            why = _mismatch(s, a, self._where(i))
            if why:
                return head + why
        out = []
        for s, a in zip(self.specs, args):
            _collect(s, a, out)
        for t, example, name in zip(out, self.examples, self.tensor_names):
            if t.shape != example.shape or t.dtype is not example.dtype or t.device != example.device:
                return (f"{head}{name} must have the capture's {_describe(example)}; got "
                        f"{_describe(t)}: a graph replays fixed shapes, dtypes and a fixed "
                        f"device, so {_AGAIN}")
        return head + "the call matches the capture"  # not reached from tensors()

    def keyword_error(self, kwargs: dict) -> ValueError:
        hints = []
        for k in kwargs:
            if k in self.arg_names:
                hints.append(f"'{k}' is argument {self.arg_names.index(k)} of {self.owner}.forward")
        hint = f" ({'; '.join(hints)})" if hints else ""
        return ValueError(
            f"argument '{next(iter(kwargs))}': a CUDA-graphed {self.owner} takes its arguments "
            f"positionally, exactly as they were captured{hint}: pass every argument by "
            f"position, e.g. levels.nn.cuda_graph(mha, x, None, None, True) and then "
            f"graphed(x, None, None, True) for causal=True")

    def check_module(self) -> None:
        """RuntimeError when the module changed since capture in a way the graph cannot see."""
        for name, m, training, level in self.modes:
            if m.training is not training or (level is not None and m._level != level):
                what = f"{self.owner}.{name}" if name else self.owner
                if level is not None and m._level != level:
                    raise RuntimeError(
                        f"levels.nn.cuda_graph: {what} was captured at level {level!r} and is "
                        f"now at level {m._level!r}, but the graph replays the kernels of its "
                        f"capture: set the level back, or {_AGAIN}")
                modes = ("eval", "training")
                raise RuntimeError(
                    f"levels.nn.cuda_graph: {what} was captured in {modes[training]} mode and is "
                    f"now in {modes[m.training]} mode, but the graph replays its capture's mode "
                    f"(BatchNorm's batch or running statistics): call .{('eval', 'train')[training]}() "
                    f"again, or {_AGAIN}")
        for table, key, t, address, name, kind in self.state:
            if table.get(key) is not t or t.data_ptr() != address:
                raise RuntimeError(
                    f"levels.nn.cuda_graph: {self.owner}'s {kind} '{name}' was replaced or moved "
                    f"since capture (a new tensor, .to(), .data = ...), but the graph reads the "
                    f"memory it was captured with: update {kind}s in place (load_state_dict, an "
                    f"optimizer, .copy_()), or {_AGAIN}")


class _Replay(torch.autograd.Function):
    """One graphed call under autograd: forward replays the forward graph, backward the
    backward graph (make_graphed_callables' `Graphed`, with the checks described above)."""

    @staticmethod
    def forward(ctx, graphed, *tensors):  # the call's tensors, then the trainable parameters
        graphed._replay(tensors[:graphed._n_inputs])
        ctx.graphed, ctx.replay = graphed, graphed._replays
        outs = graphed._outputs(fresh=True)
        if not graphed.clone_outputs:
            ctx.versions = [o._version for o in graphed._static_outputs]
        fixed = [o for o, diff in zip(outs, graphed._differentiable) if not diff]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        g = ctx.graphed
        if ctx.replay != g._replays:
            raise RuntimeError(
                f"levels.nn.cuda_graph: backward of a graphed call after the graph was replayed "
                f"again ({g._replays - ctx.replay} call(s) later): the captured backward reads the "
                f"activations of the graph's latest forward, not this call's. Run each call's "
                f"backward before the next call of the graphed module, or call the module "
                f"directly for this pattern")
        if g._backward_of == ctx.replay:
            raise RuntimeError(
                "levels.nn.cuda_graph: a second backward through one graphed call (retain_graph="
                "True): the captured backward reuses the memory of the activations it has read, "
                "so it runs once per call. Call the module directly to backpropagate twice")
        if not g.clone_outputs and ctx.versions != [o._version for o in g._static_outputs]:
            raise RuntimeError(
                "levels.nn.cuda_graph: an output of a graphed call was modified in place before "
                "its backward: the outputs are the graph's own memory, which the captured "
                "backward may read. Modify a clone, or capture with clone_outputs=True")
        for static, grad in zip(g._static_grad_outputs, grads):
            if static is not None and grad.data_ptr() != static.data_ptr():
                static.copy_(grad)
        g._backward_graph.replay()
        g._backward_of = ctx.replay
        # fresh tensors, never the graph's buffers: AccumulateGrad may keep what it is given
        # as `.grad`, and the next replay would overwrite it (pytorch/pytorch#181723)
        return (None,) + tuple(s.clone() if s is not None and need else None
                               for s, need in zip(g._static_grads, ctx.needs_input_grad[1:]))


class GraphedModule(nn.Module):
    """A module's call captured as a CUDA graph (see `cuda_graph`, which makes one).

    Attributes: `module` (the module, whose parameters and buffers the graph reads and
    updates), `backward` (whether the backward was captured too), `clone_outputs`,
    `static_args` (the graph's own input tensors, arranged as the example arguments: fill
    them in place and pass them back, `graphed(*graphed.static_args)`, to skip the per-call
    copy), `levels` (each levels.nn layer's level at capture)."""

    def __init__(self, module: nn.Module, example_args: tuple, warmup: int, backward,
                 clone_outputs: bool):
        super().__init__()
        sig = _Signature(module, example_args)  # refuses level="auto" before anything else
        self.module = module
        self.clone_outputs = bool(clone_outputs)
        self._sig = sig
        self.levels = dict(sig.levels)
        device = self._device(module, sig)
        if torch.is_autocast_enabled("cuda"):
            raise ValueError("levels.nn.cuda_graph: capture under torch.autocast is not "
                             "supported (the graph would fix autocast's casts): cast the module "
                             "and the inputs to the dtype you want instead")
        if any(b.requires_grad for b in module.buffers()):
            raise ValueError("argument 'module': a buffer requires grad; a CUDA graph "
                             "differentiates parameters and arguments only")
        params = [p for p in module.parameters()]
        wants = any(t.requires_grad for t in sig.examples) or any(p.requires_grad for p in params)
        if backward is None:
            backward = torch.is_grad_enabled() and wants
        elif backward and not wants:
            raise ValueError("argument 'backward': backward=True, but nothing requires grad (no "
                             "parameter of the module, no example argument): pass backward=False, "
                             "or example tensors that require grad")
        self.backward = bool(backward)
        with torch.cuda.device(device):
            self._capture(module, sig, int(warmup), params)

    @staticmethod
    def _device(module, sig) -> torch.device:
        where = [(name, t) for name, t in zip(sig.tensor_names, sig.examples)]
        where += [(f"{kind} '{name}' of argument 'module'", t)
                  for _, _, t, _, name, kind in sig.state]
        for name, t in where:
            if t.device.type != "cuda":
                raise ValueError(f"{name} is on {t.device}: {_NO_CUDA}")
        if not torch.cuda.is_available():
            raise RuntimeError(f"levels.nn.cuda_graph: no CUDA device here: {_NO_CUDA}")
        if not where:
            raise ValueError(f"argument 'module': neither it nor the example arguments hold a "
                             f"tensor, so there is no device to capture on: {_NO_CUDA}")
        devices = {t.device for _, t in where}
        if len(devices) > 1:
            raise ValueError(f"levels.nn.cuda_graph: the module and the example arguments must "
                             f"be on one CUDA device; got {sorted(map(str, devices))}")
        return devices.pop()

    def _capture(self, module, sig, warmup, params):
        what = f"{sig.owner} at level(s) {sorted(set(self.levels.values())) or 'n/a'}"
        statics = []
        for t in sig.examples:
            s = torch.empty_like(t, memory_format=torch.preserve_format)
            s.copy_(t.detach())
            statics.append(s.requires_grad_(self.backward and t.requires_grad))
        self._static_inputs = statics
        self._n_inputs = len(statics)
        it = iter(statics)
        self.static_args = tuple(_build(s, it) for s in sig.specs)
        self._params = [p for p in params if p.requires_grad] if self.backward else []
        self._frozen = [p for p in params if not p.requires_grad]
        self._all_params = params
        surface = [s for s in statics if s.requires_grad] + self._params

        def grads_of(outs, grad_outputs):
            diff = [o for o in outs if o.requires_grad]
            if not diff:
                raise RuntimeError(
                    f"levels.nn.cuda_graph: backward was asked for, but no output of {what} "
                    f"requires grad: pass backward=False")
            return torch.autograd.grad(diff, surface, grad_outputs(diff), allow_unused=True)

        # Warm-up on a side stream (Triton compiles, cuBLAS/cuDNN pick their kernels, lazy
        # initialization happens here, not inside the capture). It runs the module, so a
        # training-mode BatchNorm would update its running statistics `warmup` times: every
        # buffer is put back afterwards (after the capture too, which on a GPU runs nothing).
        # The warm-up's errors are the module's own: raised as they are.
        buffers = list(module.buffers())
        saved = [b.detach().clone() for b in buffers]
        try:
            torch.cuda.synchronize()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.set_grad_enabled(self.backward):
                for _ in range(max(1, warmup)):
                    outs = []
                    _spec(module(*self.static_args), "output", outs, [], "output")
                    if self.backward:
                        grads_of(outs, lambda diff: [torch.zeros_like(o) for o in diff])
                    del outs
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            # Level 4's persistent LSTM reports a barrier that gave up through a word its
            # later calls read (triton_kernels/lstm.py _sticky), and nothing is read during a
            # capture: read it now (raises if a warm-up call gave up at the barrier).
            lstm = sys.modules.get("triton_kernels.lstm")
            if lstm is not None and hasattr(lstm, "check_barrier"):
                lstm.check_barrier(wait=True)
            try:
                outs = self._record(module, grads_of, statics)
            except Exception as exc:
                raise RuntimeError(
                    f"levels.nn.cuda_graph: capturing {what} failed: {type(exc).__name__}: "
                    f"{exc}. A CUDA graph holds GPU work only: a call that waits for the GPU "
                    f"(.item(), printing a tensor), copies between CPU and GPU, or chooses its "
                    f"work from tensor values cannot be captured. Call the module directly, or "
                    f"capture it at another level" + (
                        ", or the forward only (backward=False, under torch.no_grad())"
                        if self.backward else "")) from exc
        finally:
            with torch.no_grad():
                for b, s in zip(buffers, saved):
                    b.copy_(s)
        self._static_outputs = [o.detach() for o in outs]
        self._replays = 0  # forward replays so far: a call's backward must follow it directly
        self._backward_of = 0  # the replay whose backward ran last (it runs once)

    def _record(self, module, grads_of, statics) -> list:
        """Capture the forward (and the backward) into one memory pool; returns the outputs."""
        pool = torch.cuda.graph_pool_handle()
        self._graph = torch.cuda.CUDAGraph()
        self._backward_graph = None
        with torch.set_grad_enabled(self.backward):
            with torch.cuda.graph(self._graph, pool=pool):
                raw = module(*self.static_args)
            outs = []
            self._out_spec = _spec(raw, "output", outs, [], "output")
            self._differentiable = [o.requires_grad for o in outs]
            if not self.backward:
                return outs
            self._static_grad_outputs = [torch.empty_like(o) if o.requires_grad else None
                                         for o in outs]
            self._backward_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._backward_graph, pool=pool):
                grads = grads_of(outs, lambda diff: [g for g in self._static_grad_outputs
                                                     if g is not None])
        grads = iter(grads)  # one per tensor of `surface`: the inputs requiring grad, params
        self._static_grads = [next(grads) if t.requires_grad else None
                              for t in statics + self._params]
        return outs

    def _replay(self, tensors) -> None:
        for t, s in zip(tensors, self._static_inputs):
            if t is not s:
                s.copy_(t)
        self._graph.replay()
        self._replays += 1

    def _outputs(self, fresh: bool = False) -> list:
        """The outputs a call returns: clones (clone_outputs=True), else the graph's own
        output tensors; `fresh`: new tensor objects on that memory (what autograd needs)."""
        if self.clone_outputs:
            return [o.clone() for o in self._static_outputs]
        return [o.detach() for o in self._static_outputs] if fresh else self._static_outputs

    def forward(self, *args, **kwargs):
        sig = self._sig
        if kwargs:
            raise sig.keyword_error(kwargs)
        tensors = sig.tensors(args)
        sig.check_module()
        if torch.is_autocast_enabled("cuda"):
            raise RuntimeError("levels.nn.cuda_graph: called under torch.autocast, but the graph "
                               "was captured without it and replays the capture's dtypes: call it "
                               "outside autocast")
        if torch.is_grad_enabled():
            if self.backward:
                for t, s, name in zip(tensors, self._static_inputs, sig.tensor_names):
                    if t.requires_grad and not s.requires_grad:
                        raise RuntimeError(
                            f"levels.nn.cuda_graph: {name} requires grad, but its example did "
                            f"not, so the graph computes no gradient for it: capture with an "
                            f"example that requires grad, or pass it detached")
                for p in self._frozen:
                    if p.requires_grad:
                        raise RuntimeError(
                            "levels.nn.cuda_graph: a parameter that did not require grad at "
                            "capture requires it now, and the graph computes no gradient for "
                            f"it: {_AGAIN}")
                outs = _Replay.apply(self, *tensors, *self._params)
                return outs[0] if self._out_spec is _TENSOR else _build(self._out_spec, iter(outs))
            if any(t.requires_grad for t in tensors) or any(p.requires_grad for p in self._all_params):
                raise RuntimeError(
                    "levels.nn.cuda_graph: this graph holds the forward only (captured with "
                    "backward=False or under torch.no_grad()), so its outputs carry no gradient, "
                    "but grad is enabled and an argument or parameter requires grad: call it "
                    "under torch.no_grad() (or torch.inference_mode()), or capture with grad "
                    "enabled to graph the backward too")
        self._replay(tensors)
        outs = self._outputs()
        return outs[0] if self._out_spec is _TENSOR else _build(self._out_spec, iter(outs))

    def extra_repr(self) -> str:
        return (f"levels={self.levels}, backward={self.backward}, "
                f"clone_outputs={self.clone_outputs}")


def cuda_graph(module: nn.Module, *example_args, warmup: int = 3, backward: bool | None = None,
               clone_outputs: bool = False, **example_kwargs) -> GraphedModule:
    """Capture `module(*example_args)` as a CUDA graph; returns a module that replays it.

        layer = levels.nn.LayerNorm(1024, level="triton", device="cuda")
        fast = levels.nn.cuda_graph(layer, torch.randn(8, 1024, device="cuda"))
        y = fast(x)        # x: the example's shape, dtype and device; y: overwritten next call

    A replay is one graph launch instead of the host's Python, validation, autograd and one
    launch per kernel: it pays off where the host, not the GPU, sets the time per call (small
    problems; compare `levels bench --overhead`, its "+ CUDA graph" rows).

    Arguments are positional, as `module.forward` takes them (for attention with causal=True:
    `cuda_graph(mha, x, None, None, True)`, then `fast(x, None, None, True)`): tensors, tuples
    or lists of them (the LSTM's `hx`), and constants (None, bools, numbers, strings), which
    the graph fixes. Each call is checked against the capture and refused with a ValueError
    naming the argument when its structure, a constant, or a tensor's shape, dtype or device
    differs (capture another graph for it). A tensor may have other strides than its example:
    its values are copied into the graph's own input buffer (one copy per tensor per call;
    pass `fast.static_args`, filled in place, to skip it). The module must stay as captured:
    a changed level, train/eval mode, or a parameter or buffer replaced or moved (rather than
    updated in place, as an optimizer or load_state_dict does) is refused with a RuntimeError.
    `level="auto"` is refused at capture: it may choose another level per call.

    backward: None (default) captures the backward too when grad is enabled at capture and a
    parameter or an example argument requires grad; True requires it; False captures the
    forward only, which then must be called with grad disabled (torch.no_grad()) unless
    nothing requires grad. A call's tensors may require grad where their examples did.
    Gradients reach `.grad` and `torch.autograd.grad` as fresh tensors. A backward must run
    before the next call, and once: one graph holds one call's activations (a backward after
    a later call, or a second one with retain_graph=True, raises).

    Outputs: by default the returned tensors ARE the graph's output memory, as with torch's
    own CUDA graphs: the next call overwrites them (`y1 = fast(a); y2 = fast(b)` leaves y1
    equal to y2). Keep a value with `.clone()`, or pass clone_outputs=True to get fresh
    tensors from every call, at one copy kernel per output per call. Do not modify outputs
    in place before their backward (raises).

    warmup: calls run before capture, on a side stream (compiles, library autotuning, lazy
    initialization); buffers they update (BatchNorm's running statistics) are restored.
    The module must be in the train/eval mode it will run in. Nothing on the host runs at
    replay: the level's validation, its Python, hooks and prints ran at capture only, as did
    Level 4's LSTM barrier check (a replay that gives up at the barrier returns NaN).
    Capturing takes the warm-up calls plus milliseconds, and the graph keeps a private
    memory pool (its inputs, intermediates, outputs and, with backward, the activations)
    while it lives. Errors: ValueError for the arguments, RuntimeError without a CUDA device
    ("CUDA graphs replay GPU work ...") or when capture fails (work a graph cannot hold).
    """
    if example_kwargs:
        name = next(iter(example_kwargs))
        raise ValueError(
            f"argument '{name}': levels.nn.cuda_graph takes the module's example arguments "
            f"positionally (its own keywords are warmup, backward and clone_outputs): pass "
            f"{name} by position, in {type(module).__name__}.forward's order, e.g. "
            f"cuda_graph(mha, x, None, None, True) for causal=True")
    if not isinstance(module, nn.Module):
        raise TypeError(f"argument 'module' must be a torch.nn.Module; got {type(module).__name__}")
    if backward not in (None, True, False):
        raise ValueError(f"argument 'backward' must be None (automatic), True or False; "
                         f"got {backward!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"argument 'warmup' must be an int >= 1 (calls before capture: "
                         f"compiles and lazy initialization must not happen inside it); "
                         f"got {warmup!r}")
    return GraphedModule(module, example_args, warmup, backward, clone_outputs)


__all__ = ["GraphedModule", "cuda_graph"]
