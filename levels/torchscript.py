"""Level 2 — TorchScript. Not built yet (issue #3)."""

from ._pending import pending_level

globals().update(pending_level("Level 2 (TorchScript) is not implemented yet (issue #3)"))
