"""Where a training step's time goes, layer type by layer type (`levels train --breakdown`).

A model that is 1.2x faster when one component is 3x faster is Amdahl at work; this says which
layers hold the rest. torch.profiler records a few training steps; every layer of a type the
levels implement (and the embedding, the linear layers and the optimizer step) is
wrapped in a `record_function` scope for its forward *and* its backward, so that each kernel
is charged to the layer that launched it:

    forward    a forward pre-hook opens the scope, a forward hook closes it;
    backward   a full backward pre-hook opens it when the layer's output gradients are ready,
               a full backward hook closes it when its input gradients are done: the layer's
               backward kernels run between the two, on the autograd engine's thread.

What a scope holds is the device time of the kernels launched inside it (CUDA time on a GPU,
CPU time on a CPU), summed over the layers of that type and divided by the number of steps.
"other" is the rest of the step: residual adds, gradient clipping, what no scope covers. Only
the outermost layer of interest is wrapped (an MLP's Linear layers are the MLP's).

What it costs: the hooks themselves and the profiler's bookkeeping, a few µs a layer: the
breakdown's step time is a little longer than the training's, and the fractions are what to
read, not the absolute times.
"""

from __future__ import annotations

import warnings

import functools

import torch
from torch import nn

from .. import cards

# The parts around the components' layers, by class name
AROUND = {"Embedding": "embedding", "Linear": "linear (head, projections)"}


@functools.cache
def kinds() -> dict[str, str]:
    """Layer types by class name: each card's layers (levels.nn's and their torch twins,
    NN_MODULES) under its component's name, and the parts around them."""
    return {cls: name for name in cards.names() for cls in cards.get(name).nn_modules} | AROUND


def _kind(module: nn.Module) -> str | None:
    return kinds().get(type(module).__name__)


def _outermost(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(kind, module) of each layer of interest with no layer of interest above it."""
    found = []

    def walk(module):
        for child in module.children():
            kind = _kind(child)
            if kind is not None:
                found.append((kind, child))
            else:
                walk(child)

    walk(model)
    return found


class _Scopes:
    """record_function scopes opened and closed by module hooks, for forward and backward."""

    def __init__(self, model: nn.Module):
        self.handles, self.open = [], {}
        for kind, module in _outermost(model):
            self._hook(kind, module)

    def _enter(self, key, name):
        scope = torch.profiler.record_function(name)
        scope.__enter__()
        self.open.setdefault(key, []).append(scope)

    def _exit(self, key):
        stack = self.open.get(key)
        if stack:
            stack.pop().__exit__(None, None, None)

    def _hook(self, kind: str, module: nn.Module) -> None:
        fwd, bwd = (id(module), "fwd"), (id(module), "bwd")
        self.handles += [
            module.register_forward_pre_hook(lambda m, a: self._enter(fwd, f"layer: {kind}")),
            module.register_forward_hook(lambda m, a, out: self._exit(fwd)),
            module.register_full_backward_pre_hook(lambda m, g: self._enter(bwd, f"layer: {kind}")),
            module.register_full_backward_hook(lambda m, gi, go: self._exit(bwd)),
        ]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for stack in self.open.values():
            while stack:
                stack.pop().__exit__(None, None, None)


def breakdown(net: nn.Module, inner: nn.Module, batches, loss_of, lr: float, steps: int = 3,
              warmup: int = 1) -> dict:
    """Profile `steps` training steps of `net` (after `warmup` unprofiled ones) with the
    layers of `inner` (the model inside `net`) scoped; returns ms per step by layer type."""
    device = next(inner.parameters()).device
    cuda = device.type == "cuda"
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    batches = list(batches)
    if len(batches) < warmup + steps:
        raise ValueError(f"breakdown needs {warmup + steps} batches; got {len(batches)}")

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(net(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        with torch.profiler.record_function("layer: optimizer step"):
            opt.step()

    net.train()
    for x, y in batches[:warmup]:
        step(x, y)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    scopes = _Scopes(inner)
    try:
        with warnings.catch_warnings():
            # A first layer whose inputs need no gradient (the embedding of token ids) fires
            # both its backward hooks at once, and torch warns so: its backward is "other".
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            if cuda:
                torch.cuda.synchronize(device)
            with torch.profiler.profile(activities=activities) as prof:
                with torch.profiler.record_function("layer: step"):
                    for x, y in batches[warmup:warmup + steps]:
                        step(x, y)
                    if cuda:
                        torch.cuda.synchronize(device)
    finally:
        scopes.remove()
    return _summarize(prof.events(), steps, cuda)


def _summarize(events, steps: int, cuda: bool) -> dict:
    """ms per step by layer type from the profiler's events. On a GPU: the device time of the
    kernels each scope launched (its own and its children's, on the thread that opened it),
    and as the step's total every kernel once. The profiler also records each scope as a
    range on the GPU timeline (a "user annotation", same name): that is a span with gaps, not
    kernel time, and is left out of both."""
    from torch.autograd import DeviceType

    scopes: dict[str, float] = {}
    total = 0.0
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith("layer: "):
            name = e.name.removeprefix("layer: ")
            spent = e.device_time_total if cuda else e.cpu_time_total
            scopes[name] = scopes.get(name, 0.0) + spent
        elif cuda and e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            total += e.time_range.end - e.time_range.start  # a kernel, memset or copy
    step = scopes.pop("step", 0.0)
    if not cuda:
        total = step  # the CPU time of the steps (autograd runs CPU work on this thread)
    ms = {k: v / steps / 1e3 for k, v in sorted(scopes.items(), key=lambda kv: -kv[1])}
    step_ms = total / steps / 1e3
    ms["other (residual adds, loss, gradient clipping, ...)"] = max(step_ms - sum(ms.values()), 0.0)
    return {"clock": "GPU kernel time" if cuda else "CPU time", "steps": steps, "step_ms": step_ms,
            "ms_per_step": ms, "fraction": {k: (v / step_ms if step_ms else None) for k, v in ms.items()}}
