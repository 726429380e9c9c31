"""Level 5 — CUDA C++ through torch.utils.cpp_extension.load_inline. Not built yet."""

from ._pending import pending_level

globals().update(pending_level("Level 5 (CUDA C++) is not implemented yet: no issue has built it"))
