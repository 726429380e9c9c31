"""Level 3 — torch.compile. Not built yet (issue #3)."""

from ._pending import pending_level

globals().update(pending_level("Level 3 (torch.compile) is not implemented yet (issue #3)"))
