"""Every Level 5 component picks its rung the same way (cuda_kernels/versions.py), and every
rung it offers is explained in the opening comment of its kernel file. Runs without a GPU."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from cuda_kernels import versions

# component -> (its kernel file, how that file's opening comment names a version)
KERNEL_FILES = {"attention": ("attention.cu", r"^//\s+v{v}\s"),
                "layer_norm": ("layer_norm.cu", r"^//\s+v{v}\s"),
                "conv_bn": ("conv_bn.cu", r"^//\s+v{v}\s"),
                "mlp": ("gemm.cu", r"^//\s+version {v}\s"),
                "lstm": ("lstm.cu", r"^//\s+v{v}\s"),
                "rms_norm": ("rms_norm.cu", r"^//\s+v{v}\s"),
                "newton_schulz": ("newton_schulz.cu", r"^//\s+version {v}\s")}


@pytest.mark.parametrize("component", sorted(KERNEL_FILES))
def test_every_version_is_explained_at_the_top_of_its_kernel_file(component):
    module = importlib.import_module(f"cuda_kernels.{component}")
    name, pattern = KERNEL_FILES[component]
    opening = (Path(module.__file__).with_name(name)).read_text().split("#include")[0]
    for v in module.VERSIONS:
        assert re.search(pattern.format(v=v), opening, re.M), f"version {v} missing from {name}"
    assert module.DEFAULT_VERSION in module.VERSIONS
    # no version declares TF32: fp32 inputs take an exact path at every rung
    assert module.uses_tf32(torch.device("cuda"), torch.float32) is False


@pytest.mark.parametrize("component", sorted(KERNEL_FILES))
def test_version_comes_from_argument_then_environment_then_default(component, monkeypatch):
    module = importlib.import_module(f"cuda_kernels.{component}")
    env, choices = versions.env_name(component), sorted(module.VERSIONS)
    assert module.ENV_VERSION == env
    monkeypatch.delenv(env, raising=False)
    # a ladder whose default is a per-call rule its op applies (layer_norm: by x's address)
    # resolves to the rule's marker, RULE, which the op turns into a version
    assert module.resolve_version() == getattr(module, "RULE", module.DEFAULT_VERSION)
    assert module.resolve_version(choices[0]) == choices[0]
    other = choices[1] if len(choices) > 1 else choices[0]  # a ladder of one rung so far
    monkeypatch.setenv(env, str(other))
    assert module.resolve_version() == other
    assert module.resolve_version(choices[-1]) == choices[-1]  # the argument wins
    monkeypatch.setenv(env, "nine")
    with pytest.raises(ValueError, match=rf"{component}: \${env} must be one of .*'nine'"):
        module.resolve_version()
    for bad in (choices[-1] + 1, 0, str(choices[0]), True):
        with pytest.raises(ValueError, match=rf"{component}: argument 'version' must be one of"):
            module.resolve_version(bad)
