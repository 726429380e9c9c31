"""Data the models train on, with no download: text every Python install has, and images
generated in code. Both are deterministic: the same seed gives the same batches, bit for bit.

Text (`stdlib_corpus`): the source files of a fixed list of standard-library modules, read
from this interpreter's own installation at run time, as bytes. Real text with real
structure (indentation, keywords, docstrings in English), about 1.3 MB, and it is on every
machine that can run this code. The vocabulary is the set of byte values that occur (about
a hundred: source code is mostly ASCII). The split is per file: the first 90% of each file
trains, the last 10% validates, so validation covers every module and no training window
overlaps a validation one. The exact bytes depend on the Python version (the standard
library changes), so the corpus records the version and a SHA-256 of what it read.

Images (`grating_batches`): oriented sinusoidal gratings in noise; the class is the
orientation (8 classes: 0, 22.5, ..., 157.5 degrees). Why synthetic: no download and no
dataset licence, deterministic from the seed, generated in milliseconds at any size (64x64
for the GPU preset), and still a task that needs learning: the frequency, phase, colour
and contrast vary, the orientation is jittered by up to a quarter of the spacing, and the
noise is stronger than the signal (standard deviation 1.5 against amplitudes of 0.5-1),
so no single pixel tells the class; an oriented filter over a neighbourhood does, which is
what convolutions learn. (With 4 classes and half the noise the small CNN's loss fell to
0.003 in 100 steps: a flat curve, whose relative differences say nothing. With these, ~0.2.)

Batches are made up front (`*_batches(..., steps)`), all of them: a training run then does
no data work inside its timed steps, and every level of a comparison gets the very same
list, in the same order. Under DistributedDataParallel each of `world` processes takes its
slice (`rank`) of the same global batch, so W processes with batch B see exactly what one
process with batch W*B sees.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

CLASSES = 8    # orientations of the image task (see above)
NOISE = 1.5    # standard deviation of its Gaussian noise

# Sorted by name, read in this order; module files and whole packages (every .py below them).
CORPUS_MODULES = ("argparse", "collections", "dataclasses", "email", "functools", "html", "http",
                  "json", "logging", "textwrap", "urllib")
VAL_FRACTION = 0.1


@dataclass
class Corpus:
    train: torch.Tensor        # int64 token ids
    val: torch.Tensor
    vocab: bytes               # token id i is the byte vocab[i]
    files: list[str] = field(default_factory=list)   # relative to the standard library
    sha256: str = ""
    python: str = ""

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def decode(self, ids) -> str:
        return bytes(self.vocab[int(i)] for i in ids).decode("utf-8", errors="replace")

    def describe(self) -> dict:
        return {"source": "Python standard library source files, read at run time",
                "modules": list(CORPUS_MODULES), "files": len(self.files),
                "train_tokens": int(self.train.numel()), "val_tokens": int(self.val.numel()),
                "vocab": self.vocab_size, "val_fraction": VAL_FRACTION,
                "split": "per file: first 90% train, last 10% val",
                "python": self.python, "sha256": self.sha256}


def _source_files(module: str) -> list[Path]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"the standard-library module {module!r} has no Python source "
                                f"in this installation (found {spec and spec.origin!r}); the "
                                f"character models train on the source of {', '.join(CORPUS_MODULES)}")
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: every .py file below it
        return sorted(origin.parent.rglob("*.py"), key=lambda p: p.relative_to(origin.parent).as_posix())
    return [origin]


def stdlib_corpus(modules=CORPUS_MODULES) -> Corpus:
    """The corpus of the character models (see the module doc)."""
    root = Path(importlib.util.find_spec("json").origin).parent.parent  # the stdlib directory
    train_parts, val_parts, names = [], [], []
    digest = hashlib.sha256()
    for module in modules:
        for path in _source_files(module):
            data = path.read_bytes()
            if not data:
                continue
            digest.update(data)
            cut = int(len(data) * (1 - VAL_FRACTION))
            train_parts.append(data[:cut])
            val_parts.append(data[cut:])
            names.append(path.relative_to(root).as_posix())
    train, val = b"".join(train_parts), b"".join(val_parts)
    vocab = bytes(sorted(set(train) | set(val)))
    table = torch.full((256,), -1, dtype=torch.int64)
    table[torch.tensor(list(vocab))] = torch.arange(len(vocab))

    def encode(raw: bytes) -> torch.Tensor:
        return table[torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()]

    return Corpus(encode(train), encode(val), vocab, names, digest.hexdigest(),
                  f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}")


def _check(name: str, value: int, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"argument '{name}' must be an int >= {low}; got {value!r}")


def _check_shard(rank: int, world: int) -> None:
    _check("world", world)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"argument 'rank' must be an int in [0, world={world}); got {rank!r}")


def text_batches(tokens: torch.Tensor, batch: int, seq_len: int, steps: int, seed: int,
                 rank: int = 0, world: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` batches of (inputs, targets), each (batch, seq_len) int64: windows of `tokens`
    at random offsets (drawn from `seed`), targets shifted by one token. With `world` > 1,
    rank `rank`'s slice of a global batch of world * batch windows."""
    for name, value in (("batch", batch), ("seq_len", seq_len), ("steps", steps)):
        _check(name, value)
    _check_shard(rank, world)
    if tokens.numel() < seq_len + 2:
        raise ValueError(f"argument 'tokens' must hold more than seq_len + 1 = {seq_len + 1} "
                         f"tokens; got {tokens.numel()}")
    g = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, tokens.numel() - seq_len - 1, (steps, world * batch), generator=g)
    offsets = offsets[:, rank * batch:(rank + 1) * batch]
    windows = tokens[offsets[..., None] + torch.arange(seq_len + 1)]  # (steps, batch, seq_len + 1)
    return [(w[:, :-1], w[:, 1:]) for w in windows]


def text_eval_batches(tokens: torch.Tensor, batch: int, seq_len: int, n_batches: int):
    """Evenly spaced windows of `tokens` (no randomness): the same validation set every run."""
    for name, value in (("batch", batch), ("seq_len", seq_len), ("n_batches", n_batches)):
        _check(name, value)
    count = batch * n_batches
    last = tokens.numel() - seq_len - 1
    if last < 0:
        raise ValueError(f"argument 'tokens' must hold more than seq_len + 1 = {seq_len + 1} "
                         f"tokens; got {tokens.numel()}")
    offsets = torch.linspace(0, last, count).long().view(n_batches, batch)
    windows = tokens[offsets[..., None] + torch.arange(seq_len + 1)]
    return [(w[:, :-1], w[:, 1:]) for w in windows]


def _gratings(n: int, classes: int, channels: int, size: int, g: torch.Generator):
    labels = torch.randint(0, classes, (n,), generator=g)
    jitter = (torch.rand(n, generator=g) - 0.5) * (math.pi / classes / 2)  # +-1/4 of the spacing
    theta = labels * (math.pi / classes) + jitter
    freq = 2.0 + 4.0 * torch.rand(n, generator=g)            # 2 to 6 cycles across the image
    phase = 2 * math.pi * torch.rand(n, generator=g)
    amp = 0.5 + 0.5 * torch.rand(n, channels, generator=g)   # colour and contrast
    amp = amp * torch.where(torch.rand(n, channels, generator=g) < 0.5, -1.0, 1.0)
    coords = torch.arange(size, dtype=torch.float32) / size
    u, v = coords[None, :, None], coords[None, None, :]
    along = u * torch.cos(theta)[:, None, None] + v * torch.sin(theta)[:, None, None]
    wave = torch.sin(2 * math.pi * freq[:, None, None] * along + phase[:, None, None])
    images = amp[:, :, None, None] * wave[:, None] + NOISE * torch.randn(n, channels, size, size, generator=g)
    return images, labels


def grating_batches(batch: int, size: int, steps: int, seed: int, classes: int = CLASSES, channels: int = 3,
                    rank: int = 0, world: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` batches of (images (batch, channels, size, size) float32, labels (batch,) int64);
    with `world` > 1, rank `rank`'s slice of a global batch of world * batch images."""
    for name, value in (("batch", batch), ("size", size), ("steps", steps), ("classes", classes),
                        ("channels", channels)):
        _check(name, value)
    _check_shard(rank, world)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):  # one draw per global batch: the stream does not depend on `steps`
        images, labels = _gratings(world * batch, classes, channels, size, g)
        rows = slice(rank * batch, (rank + 1) * batch)
        out.append((images[rows].contiguous(), labels[rows].contiguous()))
    return out


def grating_eval_batches(batch: int, size: int, n_batches: int, seed: int, classes: int = CLASSES,
                         channels: int = 3):
    """A validation set drawn from a stream of its own seed, not from the training stream."""
    return grating_batches(batch, size, n_batches, seed + 1_000_003, classes, channels)
