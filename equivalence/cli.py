"""The `levels` command line: the parser, and nothing else. Each command is a module of
equivalence/commands/ with `add_parser(subparsers)` and `run(args, console)`; this file puts
them under one program and turns what they raise into exit codes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import levels
from levels.contract import COMPONENTS

from . import settings
from .logs import warnings_to
from .commands import (agree, assignment, bench, check, compare, doctor, explain, grade, profile,
                       select, train)
from .commands.console import (EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, EXIT_USAGE, HELP_FORMAT,
                               NothingToRun, terminal_console)

WARNINGS_LOG = Path("levels-reports") / "warnings.log"

# In the order `levels --help` lists them.
COMMANDS = (check, compare, profile, select, agree, explain, bench, doctor, train, assignment, grade)


def _levels_help() -> str:
    lines = ["the five levels (name or number):"]
    for info in levels.LEVELS:
        lines.append(f"  {info.number} {info.name:<12} {info.title}")
        lines.append(f"      adds:  {info.idea}")
        lines.append(f"      costs: {info.cost}")
    return "\n".join(lines)


DESCRIPTION = f"""\
Five implementations of the same neural-network components, from idiomatic PyTorch down
to hand-written GPU kernels, and a harness that proves they compute the same function.

components: {", ".join(COMPONENTS)}

{_levels_help()}

"Identical" means: every output and every gradient within a per-dtype relative-error
bound of an independent float64 reference (see equivalence/tolerances.py).
"""

EPILOG = """\
examples:
  levels check --level native                 all components, fp32 and bf16, forward+backward
  levels check --component attention --level 4 --dtype bf16 --device cuda
  levels compare                               check and time every level on this machine
  levels profile --component mlp --scaling     one component in depth: times, roofline, plots
  levels select --component layer_norm         which level level="auto" picks here, and why
  levels agree --component lstm                level-vs-level agreement matrix
  levels explain --component mlp --level compile   what a level actually runs
  levels bench --component layer_norm          the speed goals (GPU), vs same-run baselines
  levels bench --suite models                  every level vs the best library call at real models' shapes
  levels bench --overhead                      what one call costs the host, per level
  levels doctor                                what works on this machine, and how to fix the rest
  levels train --model gpt --level all         a whole model at every level: same loss curve, speed
  levels assignment build --components layer_norm --levels native,triton --out DIR
  levels grade --repo DIR --gradescope results.json

exit codes: 0 all good, 1 a check failed (or a level raised), 2 bad arguments,
            3 nothing could run here (e.g. --device cuda without a GPU)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="levels", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HELP_FORMAT)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def other_copy_here() -> str | None:
    """A warning when the working directory is a copy of the repo (a student's) whose
    levels/ is not the one `levels` imports: every command would run the installed code,
    not the code in front of the user."""
    here = Path.cwd() / "levels" / "__init__.py"
    imported = Path(levels.__file__).resolve()
    if not here.is_file() or here.resolve() == imported:
        return None
    return (f"note: this directory has its own levels/ ({here.parent.parent}), but `levels` runs "
            f"the code installed from {imported.parent.parent}: to run yours, `pip install -e .` "
            f"here (or set PYTHONPATH={here.parent.parent})")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    console = terminal_console()
    warning = other_copy_here()
    if warning and args.command not in ("grade", "assignment"):  # those name their repos
        console.print(warning, style="yellow", markup=False)
    # Read from the environment once, here: the command and everything it calls get these.
    settings.use(settings.Settings.from_environment())
    # A library's warning goes to a log, never between our lines (equivalence/logs.py);
    # the commands that run levels also send what libraries print to their own log.
    words = sys.argv[1:] if argv is None else list(argv)
    with warnings_to(WARNINGS_LOG, "levels " + " ".join(words)) as log:
        try:
            return args.run(args, console)
        except NothingToRun as exc:
            console.print(f"levels {args.command}: {exc}", style="yellow", markup=False)
            return EXIT_NOTHING_RAN
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            console.print(f"levels {args.command}: {exc}", style="red", markup=False)
            return EXIT_USAGE
        finally:
            settings.use(None)  # a caller in the same process (a test, a notebook) reads anew
            if log.count:
                console.print(log.note(), markup=False, highlight=False)


__all__ = ["COMMANDS", "EXIT_FAILED", "EXIT_NOTHING_RAN", "EXIT_OK", "EXIT_USAGE", "build_parser",
           "main"]


if __name__ == "__main__":
    sys.exit(main())
