"""A small ResNet of ConvBN blocks, from levels.nn layers, and its plain-torch twin.

    images (B, C, S, S) -> ConvBN 3x3 stem -> ReLU
                        -> per stage: a basic residual block
                             y = ReLU(ConvBN 3x3 (stride s)) -> ConvBN 3x3
                             out = ReLU(y + shortcut(x))   shortcut: x, or a 1x1 ConvBN
                                                           (stride s) where the shape changes
                        -> global average pool -> linear head -> logits (B, classes)

He et al.'s basic block (ResNet-18's), one per stage. BatchNorm follows every convolution,
which is why the ladder's component is conv + batchnorm as one: in training mode the batch
statistics need the whole convolution output, in eval mode they fold into the weights.
The convolutions have no bias (BatchNorm's shift makes it redundant), as in ResNet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import nn as lnn
from ._common import Leveled, positive, require


@dataclass(frozen=True)
class CNNConfig:
    classes: int = 8
    in_channels: int = 3
    widths: tuple = (16, 32)   # output channels of each stage (the stem has widths[0])
    strides: tuple = (1, 2)    # each stage's first stride

    def __post_init__(self):
        positive("classes", self.classes)
        positive("in_channels", self.in_channels)
        if len(self.widths) != len(self.strides) or not self.widths:
            raise ValueError(f"arguments 'widths' and 'strides' must be non-empty and of the same "
                             f"length (one per stage); got {self.widths} and {self.strides}")
        for w in self.widths:
            positive("widths[...]", w)
        for s in self.strides:
            positive("strides[...]", s)

    def stages(self):
        """(in_channels, out_channels, stride) of each stage's block."""
        ins = (self.widths[0],) + tuple(self.widths[:-1])
        return list(zip(ins, self.widths, self.strides))


# ---------------------------------------------------------------------------------------
# The plain-torch twin
# ---------------------------------------------------------------------------------------

def _conv_bn(c_in, c_out, k, stride):
    return nn.Sequential(nn.Conv2d(c_in, c_out, k, stride, padding=k // 2, bias=False),
                         nn.BatchNorm2d(c_out))


class TorchBasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.a = _conv_bn(c_in, c_out, 3, stride)
        self.b = _conv_bn(c_out, c_out, 3, 1)
        self.shortcut = _conv_bn(c_in, c_out, 1, stride) if (c_in, stride) != (c_out, 1) else None

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class TorchResNet(nn.Module):
    def __init__(self, cfg: CNNConfig):
        super().__init__()
        self.cfg = cfg
        self.stem = _conv_bn(cfg.in_channels, cfg.widths[0], 3, 1)
        self.blocks = nn.ModuleList(TorchBasicBlock(*s) for s in cfg.stages())
        self.head = nn.Linear(cfg.widths[-1], cfg.classes)

    def forward(self, images):
        x = torch.relu(self.stem(images))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


# ---------------------------------------------------------------------------------------
# The leveled model
# ---------------------------------------------------------------------------------------

def _leveled(c_in, c_out, k, stride, level):
    return lnn.ConvBN(c_in, c_out, k, stride, padding=k // 2, bias=False, level=level)


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride, level="native"):
        super().__init__()
        self.a = _leveled(c_in, c_out, 3, stride, level)
        self.b = _leveled(c_out, c_out, 3, 1, level)
        self.shortcut = (_leveled(c_in, c_out, 1, stride, level)
                         if (c_in, stride) != (c_out, 1) else None)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(Leveled):
    def __init__(self, cfg: CNNConfig, level="native"):
        super().__init__()
        self.cfg = cfg
        self.stem = _leveled(cfg.in_channels, cfg.widths[0], 3, 1, level)
        self.blocks = nn.ModuleList(BasicBlock(*s, level=level) for s in cfg.stages())
        self.head = nn.Linear(cfg.widths[-1], cfg.classes)

    def forward(self, images):
        x = torch.relu(self.stem(images))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))

    @classmethod
    def from_torch(cls, twin: TorchResNet, level="native") -> "ResNet":
        """The leveled model with `twin`'s weights and BatchNorm statistics (copies), in the
        twin's train/eval mode."""
        require(isinstance(twin, TorchResNet), "a levels.models.TorchResNet", type(twin).__name__)

        def convert(pair: nn.Sequential) -> lnn.ConvBN:
            return lnn.ConvBN.from_torch(pair[0], pair[1], level)

        p = twin.head.weight
        model = cls(twin.cfg, level).to(device=p.device, dtype=p.dtype)
        model.stem = convert(twin.stem)
        for ours, theirs in zip(model.blocks, twin.blocks):
            ours.a, ours.b = convert(theirs.a), convert(theirs.b)
            ours.shortcut = None if theirs.shortcut is None else convert(theirs.shortcut)
        model.head.load_state_dict(twin.head.state_dict())
        return model.train(twin.training)
