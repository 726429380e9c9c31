"""What the three leveled models share: switching their level, and checking a twin's shape."""

from __future__ import annotations

from torch import nn

from .. import nn as lnn


class Leveled(nn.Module):
    """A model whose every `levels.nn` layer runs at one level."""

    def set_level(self, level) -> "Leveled":
        """Switch every levels.nn layer inside to `level` (a name, a number, or "auto")."""
        return lnn.set_level(self, level)

    @property
    def level(self) -> str:
        """The level every levels.nn layer runs at (they are switched together)."""
        found = {m.level for m in self.modules() if isinstance(m, lnn._Leveled)}
        if len(found) != 1:  # someone switched one layer by hand: say so, do not pick one
            return "mixed: " + ", ".join(sorted(found))
        return found.pop()


def require(cond: bool, what: str, got) -> None:
    if not cond:
        raise ValueError(f"from_torch: expected {what}; got {got}")


def positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"argument '{name}' must be a positive int; got {value!r}")
