"""What a run uses unless told otherwise, in one place.

- `Settings`: what the harness takes from the environment, read once (at the CLI, or on
  the first call that needs it) and then passed down as an argument:

      cache_dir   where `levels` keeps what it measured about this machine (the ceilings,
                  auto's decisions): $LEVELS_CACHE_DIR, else $XDG_CACHE_HOME/levels, else
                  ~/.cache/levels

  Every other variable the project reads belongs to the code that reads it (Level 3's
  LEVELS_COMPILE_MODE in levels/compiled.py, Level 5's build in cuda_kernels/build.py, ...);
  docs/environment.md lists them all.
- The defaults of a run on a device: what its users run (bfloat16 on a GPU, float32 on a
  CPU, whose bfloat16 GEMMs are emulated on most chips) at the size made for it.
- Level 3's compile mode for a run (`compile_mode`): the one asked for, else the one
  levels/compiled.py is configured with (LEVELS_COMPILE_MODE is read there, and only
  there), applied for the duration of the run by `CompileMode`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

# The repository this package was loaded from: its reports/ hold the runs recorded on GPUs.
REPOSITORY = Path(__file__).resolve().parent.parent
RECORDED = REPOSITORY / "reports"


@dataclass(frozen=True)
class Settings:
    cache_dir: Path

    @classmethod
    def from_environment(cls, environ=None) -> Settings:
        environ = os.environ if environ is None else environ
        root = environ.get("LEVELS_CACHE_DIR")
        if not root:
            root = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "levels"
        return cls(cache_dir=Path(root))

    def cache_path(self, name: str) -> Path:
        """Where levels keeps `name` of what it measured about this machine, per user."""
        return self.cache_dir / name


_current: Settings | None = None


def current() -> Settings:
    """The settings of this process: read from the environment on first use, then kept."""
    global _current
    if _current is None:
        _current = Settings.from_environment()
    return _current


def use(settings: Settings | None) -> None:
    """Make `settings` this process's (the CLI does, once); None: read the environment again
    on next use (tests that change it)."""
    global _current
    _current = settings


def default_dtype(device) -> str:
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def default_size(device) -> str:
    return "bench" if torch.device(device).type == "cuda" else "small"


def compile_mode(requested: str | None, device) -> str:
    """Level 3's mode for a run: `requested`, else the level's own setting on `device`."""
    import levels

    return requested or levels.get("compile").settings(device)["mode"]


class CompileMode:
    """Level 3 in `mode` on `device` for the duration, then as it was (mode None: untouched).
    Reconfiguring drops Level 3's compiled functions, so it only happens on a change."""

    def __init__(self, mode: str | None, device):
        self.mode, self.device, self.saved = mode, torch.device(device), None

    def __enter__(self):
        if self.mode is None:
            return self
        import levels

        compiled = levels.get("compile")
        current_mode = compiled.settings(self.device)["mode"]
        if current_mode != self.mode:
            self.saved = current_mode
            compiled.configure(mode=self.mode)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import levels

            levels.get("compile").configure(mode=self.saved)
