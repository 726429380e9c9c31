"""Muon (Jordan et al. 2024): momentum, then Newton-Schulz orthogonalization, for every 2-D
hidden weight; AdamW for the rest (embeddings, the output head, biases and norms' gains).

    from levels.optim import Muon, split_parameters
    hidden, rest = split_parameters(model)
    opt = Muon(hidden, rest, level="triton")      # newton_schulz at Level 4

Per step and 2-D parameter W with gradient g (all under no_grad):

    buf <- momentum * buf + g                         (the momentum buffer)
    u   <- g + momentum * buf    (Nesterov; else buf)
    O   <- newton_schulz(u in ns_dtype, steps)        (about U V^T of u's SVD: every direction
                                                       of the update the same size)
    W   <- W (1 - lr * weight_decay) - lr * sqrt(max(1, rows / cols)) * O

The optimizer step is all matrix multiplies: newton_schulz at the `level` given (any of the
five, or a registered one), which is where the levels differ.

One batched call per shape. A transformer's hidden weights come in a handful of shapes
(GPT-2 small: 4 shapes, 12 of each; Llama 2 7B: 3 shapes, 32 to 128 of each), so the step
groups them by (shape, dtype, device) and orthogonalizes each group in one call on a
(B, rows, cols) batch: 2 + 3 * steps launches at Levels 4-5 per group instead of per
parameter, and B small matrices filling the GPU together where one leaves most of it idle.

The momentum buffers of a group live in one stacked (B, rows, cols) tensor, and the state of
each parameter (`state[p]["momentum_buffer"]`, what state_dict saves) is its row of that
stack, a view. What that saves: the momentum update and the Nesterov step are one kernel
each for the whole group, and without Nesterov the stack *is* the batch newton_schulz reads
(no copy at all). What it costs: the gradients are separate tensors, so they are stacked
once a step (one copy of the group's gradients, into the buffer that then becomes the
Nesterov update, so no extra memory beyond one batch); and when a group changes (a
parameter without a gradient this step, or buffers replaced by load_state_dict) the stack is
rebuilt from the per-parameter buffers, one copy, once.

`ns_dtype` is what Muon's
reference code uses, bfloat16; None iterates in each parameter's own dtype (what
`levels train --optimizer muon` does in float32, so that the levels' loss curves can be
held to float32's bound).
"""

from __future__ import annotations

import torch

import levels


def split_parameters(model: torch.nn.Module) -> tuple[list, list]:
    """(Muon's parameters, AdamW's): the 2-D weights of every module but the embeddings and
    `model.head` (the output projection; Muon's authors leave both to AdamW: an embedding's
    rows are looked up one at a time, not multiplied as a matrix), and everything else.
    A tied weight (a head that is the token embedding) is one parameter, listed once."""
    head = getattr(model, "head", None)
    excluded = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding)
                for p in m.parameters()}
    if isinstance(head, torch.nn.Module):
        excluded |= {id(p) for p in head.parameters()}
    hidden, rest = [], []
    for p in model.parameters():  # each parameter once, tied ones too
        (hidden if p.dim() == 2 and id(p) not in excluded else rest).append(p)
    return hidden, rest


class Muon(torch.optim.Optimizer):
    def __init__(self, muon_params, adamw_params=(), lr: float = 0.02, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, weight_decay: float = 0.0,
                 adamw_lr: float = 3e-4, adamw_betas=(0.9, 0.95), adamw_eps: float = 1e-8,
                 adamw_weight_decay: float = 0.0, level="native",
                 ns_dtype: torch.dtype | None = torch.bfloat16):
        params = list(muon_params)
        for i, p in enumerate(params):
            if not isinstance(p, torch.Tensor) or p.dim() != 2:
                shape = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
                raise ValueError(f"Muon: argument 'muon_params' must hold 2-D parameters only "
                                 f"(give the others to AdamW: adamw_params); element {i} is {shape}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon: argument 'momentum' must be in [0, 1); got {momentum!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, weight_decay=weight_decay))
        self.level = levels.resolve(level).name
        self._newton_schulz = levels.get(self.level).newton_schulz
        self.ns_dtype = ns_dtype
        self._stacks: dict = {}  # (param group, shape, dtype, device) -> (params, stacked buffers)
        rest = list(adamw_params)
        self.adamw = (torch.optim.AdamW(rest, lr=adamw_lr, betas=adamw_betas, eps=adamw_eps,
                                        weight_decay=adamw_weight_decay) if rest else None)

    def zero_grad(self, set_to_none: bool = True):
        super().zero_grad(set_to_none)
        if self.adamw is not None:
            self.adamw.zero_grad(set_to_none)

    def state_dict(self):
        return {"muon": super().state_dict(),
                "adamw": self.adamw.state_dict() if self.adamw is not None else None}

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict["muon"])
        if self.adamw is not None:
            self.adamw.load_state_dict(state_dict["adamw"])

    def _momentum_stack(self, key, params: list) -> torch.Tensor:
        """The (B, rows, cols) momentum buffers of `params` (one group: same shape, dtype and
        device), each parameter's state a view of its row. Reused while the group and its
        views stand; rebuilt (one copy) from the per-parameter buffers when they do not."""
        cached = self._stacks.get(key)
        if cached is not None and len(cached[0]) == len(params) and all(
                p is q and self.state[p].get("momentum_buffer") is row
                for p, q, row in zip(params, cached[0], cached[2])):
            return cached[1]
        old = [self.state[p].get("momentum_buffer") for p in params]
        stack = torch.stack([torch.zeros_like(p) if b is None else b for p, b in zip(params, old)])
        rows = stack.unbind(0)
        for p, row in zip(params, rows):
            self.state[p]["momentum_buffer"] = row
        self._stacks[key] = (tuple(params), stack, rows)
        return stack

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            lr, momentum = group["lr"], group["momentum"]
            shapes: dict = {}  # (shape, dtype, device) -> the parameters with a gradient
            for p in group["params"]:
                if p.grad is not None:
                    shapes.setdefault((tuple(p.shape), p.dtype, p.device), []).append(p)
            for key, params in shapes.items():
                buf = self._momentum_stack((index, *key), params)
                grads = torch.stack([p.grad for p in params])
                buf.mul_(momentum).add_(grads)
                update = grads.add_(buf, alpha=momentum) if group["nesterov"] else buf
                ortho = self._newton_schulz(update.to(self.ns_dtype or key[1]),
                                            steps=group["ns_steps"]).to(key[1])
                if group["weight_decay"]:
                    torch._foreach_mul_(params, 1.0 - lr * group["weight_decay"])
                # a tall matrix's orthogonal update has smaller entries: scaled back up
                rows, cols = key[0]
                torch._foreach_add_(params, list(ortho.unbind(0)),
                                    alpha=-lr * max(1.0, rows / cols) ** 0.5)
        if self.adamw is not None:
            self.adamw.step()
        return loss


__all__ = ["Muon", "split_parameters"]
