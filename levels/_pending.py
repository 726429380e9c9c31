"""A level that is not built yet says so, and every call to it raises with that reason."""

from __future__ import annotations

from .contract import COMPONENTS


def pending_level(reason: str) -> dict:
    """The module namespace of a level that cannot run anywhere yet, for `globals().update`."""

    def unavailable_reason(device, component=None):
        return reason

    def uses_tf32(component, device, dtype):
        return False

    def make(component):
        def call(*args, **kwargs):
            raise NotImplementedError(f"{component}: {reason}")
        call.__name__ = component
        return call

    return {"unavailable_reason": unavailable_reason, "uses_tf32": uses_tf32,
            **{c: make(c) for c in COMPONENTS}}
