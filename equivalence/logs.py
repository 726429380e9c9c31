"""Where libraries' warnings go while the harness works: a log file, never the terminal.

A warning is a library's message to its own users (TorchScript's deprecation, a compiler's
hint, a numerics notice). When the harness runs a level on your behalf, to time it, check
it or choose it for level="auto", the warnings it raises are about the harness's work, not
your code: they are appended to a log, and the terminal keeps our table. Every `levels`
command does this (equivalence/cli.py, and commands/console.library_output_to for the
libraries' printed output too), and so does level="auto"'s first call of a kind
(select.decide, into `<cache>/auto.log`). Calling a level yourself is different: Level 2
shows TorchScript's deprecation to you once per process, explained (levels/torchscript.py).
"""

from __future__ import annotations

import contextlib
import datetime
import warnings
from pathlib import Path


class WarningLog:
    """Appends each warning shown to it to `path`, which it creates at the first one: a run
    with nothing to say writes nothing. `count` is how many it took."""

    def __init__(self, path, header: str = ""):
        self.path, self.header, self.count = Path(path), header, 0

    def show(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        try:
            if self.count == 0:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                stamp = datetime.datetime.now().isoformat(timespec="seconds")
                text = f"--- {stamp} {self.header}\n{text}"
            with open(self.path, "a", encoding="utf-8", errors="replace") as log:
                log.write(text)
        except OSError:
            pass  # a read-only directory: the warning is lost, never the caller's run
        self.count += 1

    def note(self) -> str:
        """One line for the end of a command: how many, and where they are."""
        return f"{self.count} warning(s) from libraries, in {self.path}" if self.count else ""


@contextlib.contextmanager
def warnings_to(path, header: str = ""):
    """Run the block with every warning it shows appended to `path` (see WarningLog).
    The filters are left as they are: what Python hides by default stays hidden."""
    log = WarningLog(path, header)
    with warnings.catch_warnings():
        warnings.showwarning = log.show
        yield log


__all__ = ["WarningLog", "warnings_to"]
