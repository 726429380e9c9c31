"""One training run's steps, for `levels train` (training.py): eager, under torch.autocast
(--amp), or replayed as one captured CUDA graph (--cuda-graph); the loss every curve is
compared on, and the check that no two parameters share a gradient tensor."""

from __future__ import annotations

import contextlib
import math
import time

import torch


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # in float32 whatever the model's dtype: a bf16 log-softmax over the vocabulary would
    # round the very number every curve is compared on
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


# ---------------------------------------------------------------------------------------
# Which runs can run here
# ---------------------------------------------------------------------------------------

def aliased_gradients(model) -> list[tuple[str, str]]:
    """Pairs of distinct parameters whose .grad is one tensor's memory. Autograd gives every
    parameter a gradient of its own; a level whose backward hands one tensor to two
    parameters breaks every in-place gradient operation (clipping, loss scaling), which then
    applies twice to it. (Tied weights are one parameter, listed once: not a pair.)"""
    seen, pairs = {}, []
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        key = (p.grad.untyped_storage().data_ptr(), p.grad.storage_offset())
        if key in seen:
            pairs.append((seen[key], name))
        seen.setdefault(key, name)
    return pairs


GRAPH_WARMUP = 3  # eager steps before a step is captured (compiles, autotunes, allocators)


def step_in_turn(generators: list, ended, per_turn: int = 1) -> None:
    """Step `train_steps` generators in turn: each takes `per_turn` steps in a row, and every
    one's turn k before any one's turn k + 1, the order rotated each round (`levels train`'s
    interleaved runs). `ended(i, result, exc)` is called once for each, when it ends: with its
    result, or with the exception it raised (the others go on); a round's endings in the
    list's order."""
    live, turn = list(range(len(generators))), 0
    while live:
        shift, endings = turn % len(live), {}
        for i in live[shift:] + live[:shift]:
            try:
                for _ in range(per_turn):
                    next(generators[i])
            except StopIteration as done:
                endings[i] = (done.value, None)
            except Exception as exc:  # noqa: BLE001 - a run that raises is a result: reported
                endings[i] = (None, exc)
        for i in live:
            if i in endings:
                ended(i, *endings[i])
        live = [i for i in live if i not in endings]
        turn += 1


def train_steps(net, inner, batches, val_batches, lr: float, on_step=None, aliased=None,
                amp: torch.dtype | None = None, cuda_graph: bool = False, world_size: int = 1,
                make_optimizer=None, optimizer_s: list | None = None):
    """A generator: trains `net` on `batches` one step per `next()` (it yields after each
    step, its time recorded), then evaluates `inner` (the model inside `net`) on `val_batches`
    and returns (losses, seconds per step, validation loss) as its StopIteration's value, so
    that `levels train` can interleave the steps of several runs. `aliased`, a list,
    receives the pairs of parameters that share one gradient tensor after the first backward.

    `amp`: the forward runs under torch.autocast of that dtype (the parameters, their
    gradients and Adam's state stay float32); float16 scales the loss (torch.amp.GradScaler)
    so that small gradients do not flush to zero. `cuda_graph`: after GRAPH_WARMUP eager steps
    (real steps of the run, on a side stream as CUDA graphs require), one whole step —
    forward, backward, clipping and Adam's update — is captured and every later step is one
    replay of it with the next batch copied into its input: no Python, no validation, no
    launches on the host. Adam runs `capturable` (its step count on the GPU) in every step of
    such a run.

    `make_optimizer(model)`: the optimizer (default Adam; `levels train --optimizer muon`
    passes levels.optim.Muon at the run's level). `optimizer_s`, a list, receives each eager
    step's optimizer time (clipping and the update), the device synchronized around it."""
    import torch.distributed as dist

    size = world_size
    params = list(net.parameters())
    opt = (make_optimizer(inner) if make_optimizer is not None
           else torch.optim.Adam(params, lr=lr, capturable=cuda_graph))
    device_type = params[0].device.type
    scaler = torch.amp.GradScaler(device_type) if amp == torch.float16 else None

    def step_fn(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=amp or torch.float32, enabled=amp is not None):
            logits = net(x)
        loss = loss_of(logits, y)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.unscale_(opt)
        return loss

    def finish_step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    net.train()
    losses, step_s = [], []

    def record(step, loss, start):
        value = loss.detach().clone()
        if size > 1:
            dist.all_reduce(value)
            value = value / size
        losses.append(value.item())  # waits for the device: the step is done when the clock stops
        step_s.append(time.perf_counter() - start)
        if on_step:
            on_step(step, losses[-1], step_s[-1])
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"the loss is {losses[-1]} at step {step}")

    graph = static = None
    side = torch.cuda.Stream() if cuda_graph else None
    for step, (x, y) in enumerate(batches):
        start = time.perf_counter()
        if graph is not None:
            static[0].copy_(x)
            static[1].copy_(y)
            graph.replay()
            record(step, static[2], start)
            yield step
            continue
        if cuda_graph:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if cuda_graph else contextlib.nullcontext():
            loss = step_fn(x, y)
            if step == 0 and aliased is not None:  # once: a property of the level's backward
                aliased.extend(aliased_gradients(inner))
            if optimizer_s is not None:
                _synchronize(params[0].device)
                opt_start = time.perf_counter()
            finish_step()
            if optimizer_s is not None:
                _synchronize(params[0].device)
                optimizer_s.append(time.perf_counter() - opt_start)
        if cuda_graph:
            torch.cuda.current_stream().wait_stream(side)
        record(step, loss, start)
        if cuda_graph and step + 1 == GRAPH_WARMUP and step + 1 < len(batches):
            graph, static = _capture_step(step_fn, finish_step, x, y)
        yield step
    # Validation with autograd on but no backward: Level 3 compiled its graphs with grad
    # enabled, and under no_grad it would compile them all again for one evaluation. On the
    # model inside: DistributedDataParallel expects a backward after every forward with
    # grad on (its second forward would raise), and every process has the whole model.
    inner.eval()
    total = 0.0
    with torch.autocast(device_type, dtype=amp or torch.float32, enabled=amp is not None):
        for x, y in val_batches:
            total += loss_of(inner(x), y).item()
    inner.train()
    return losses, step_s, total / max(len(val_batches), 1)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _capture_step(step_fn, finish_step, x, y):
    """(graph, (input, target, loss)): one training step captured as a CUDA graph on copies
    of a batch, which every replay reads; capturing runs nothing. The gradients are set to
    None first, so that the captured backward allocates them in the graph's memory and each
    replay writes them afresh (the recipe of torch's CUDA-graph notes)."""
    static_x, static_y = x.clone(), y.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step_fn(static_x, static_y)
        finish_step()
    return graph, (static_x, static_y, loss)


# ---------------------------------------------------------------------------------------
# Agreement of the loss curves
# ---------------------------------------------------------------------------------------
