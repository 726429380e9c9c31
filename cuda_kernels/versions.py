"""Which rung of a Level 5 ladder runs: one rule for every component.

    version=None  ->  $LEVELS_CUDA_VERSION_<COMPONENT> if it is set, else the component's default

so `LEVELS_CUDA_VERSION_MLP=2 levels train ...` runs version 2 wherever Level 5's MLP runs,
without touching the code (a user's choice for the process, read at each call), and
`mlp(..., version=2)` picks one for a single call: how `levels bench` times every version."""

from __future__ import annotations

import functools
import os

import torch


def env_name(component: str) -> str:
    return f"LEVELS_CUDA_VERSION_{component.upper()}"


def resolve(component: str, versions: dict, default: int, version=None) -> int:
    """The version to run; a ValueError naming where a bad value came from and the choices."""
    source = "argument 'version'"
    if version is None:
        raw = os.environ.get(env_name(component), "").strip()
        if not raw:
            return default
        source = f"${env_name(component)}"
        try:
            version = int(raw)
        except ValueError:
            version = raw
    if isinstance(version, bool) or not isinstance(version, int) or version not in versions:
        raise ValueError(f"{component}: {source} must be one of {sorted(versions)} (the Level 5 "
                         f"kernel versions); got {version!r}")
    return version


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)  # a driver query: once per GPU


def on_hopper() -> bool:
    """Whether the current CUDA device is sm_90 (H100, H200): where the ladders' Hopper rungs
    (wgmma, TMA) run, and so where a component's default is its Hopper version."""
    return torch.cuda.is_available() and _capability(torch.cuda.current_device()) == (9, 0)
