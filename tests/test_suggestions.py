"""Every command the tool or its documentation tells a user to type works.

- The doctor's fixes (every template it can suggest, on any machine) and the skip reasons
  the levels give: each command in them is parsed by the program it names (`levels`'s
  parser, pip's, `python -m`'s module lookup) with no usage error; the ones this machine
  suggests are also run, in a fresh process, and exit 0 with no library `Warning` line.
- The README's, docs/' and notebooks/README.md's command lines (fenced bash blocks and
  inline `levels ...` spans) parse, placeholders (C, L, DIR, a|b) filled with examples.
- Documented commands run in a fresh process print no `Warning` from a library, and
  neither does a first call of level="auto" (equivalence/logs.py says where they go).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import levels
from equivalence.cli import build_parser
from equivalence.commands import doctor

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "notebooks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# a command inside prose: optional VAR=value prefixes, the program, then words up to the
# end of the clause (quoted words may hold the punctuation that ends one)
COMMAND = re.compile(r"(?:(?<=^)|(?<=[\s`:;(]))((?:[A-Z_]+=\S+\s+)*"
                     r"(?:levels|python3?(?:\.\d+)?|pip)\s(?:'[^']*'|\"[^\"]*\"|[^;,()`'\"\n])*)")
# the examples a placeholder stands for, in the docs' synopsis style
PLACEHOLDERS = {"C": "layer_norm", "L": "native", "T": "fp32", "D": "cpu", "S": "tiny", "V": "default",
                "N": "2", "M": "default", "FILE": "out.json", "DIR": "out", "PATHS": "notebooks",
                "COMMAND": "check", "path/to/submission": "out"}


def commands_in(text: str) -> list[str]:
    """The shell commands quoted in a piece of prose (a fix, a reason), `&&` chains split."""
    found = []
    for match in COMMAND.finditer(text):
        if text[:match.start()].endswith("import "):
            continue  # "import levels before triton": the package, not the program
        for part in match.group(1).split("&&"):
            part = part.strip()
            if part.endswith(".") and not part.endswith(" ."):  # a sentence's full stop
                part = part[:-1]
            if part:
                found.append(part)
    return found


def _words(command: str) -> tuple[dict, list[str]]:
    """(environment, argv) of a command line; VAR=value prefixes become the environment."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def assert_parses(command: str, capsys, mention: bool = False) -> None:
    """The program the command names accepts its arguments (no usage error). A `mention`
    (an inline `levels train --cuda-graph` in a sentence names a command or an option, and
    is no line to type) may leave out what the command requires, nothing else."""
    _, words = _words(command)
    program, args = words[0], words[1:]
    if program == "levels":
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:  # --help exits 0; a usage error exits 2 with the usage
            error = capsys.readouterr().err.strip()
            if mention and "the following arguments are required" in error:
                return
            assert exc.code == 0, f"`{command}`: {error}"
    elif program == "pip":
        import warnings
        with warnings.catch_warnings():  # pip's own import of setuptools' distutils shim
            warnings.simplefilter("ignore")
            from pip._internal.commands import create_command

        try:
            create_command(args[0]).parse_args(args[1:])
        except SystemExit as exc:
            assert exc.code == 0, f"`{command}`: {capsys.readouterr().err.strip()}"
    else:  # python: a module it runs exists, or a script it runs does
        if "-m" in args:
            module = args[args.index("-m") + 1]
            import importlib.util
            assert importlib.util.find_spec(module) is not None, f"`{command}`: no module {module}"
        elif args and args[0].endswith(".py"):
            assert (ROOT / args[0]).exists(), f"`{command}`: no {args[0]}"


def fill(command: str) -> str | None:
    """A documented command with its placeholders filled in; None for a generic form."""
    command = re.sub(r"\s*\[[^\[\]]*(\[[^\]]*\])?[^\[\]]*\]", "", command)  # optional [--x Y]
    command = command.split("#")[0].strip()                                # a trailing comment
    command = re.sub(r"([^\s|]+)(?:\|[^\s|]+)+", r"\1", command)            # a|b|c: the first
    command = re.split(r" {2,}(?=[^-\s])| / ", command)[0]                  # a description
    words = command.split()
    if len(words) > 1 and words[1] in ("X", "COMMAND"):
        return None  # `levels X`: the name of any command, not one to type
    return " ".join(PLACEHOLDERS.get(w, w) for w in words)


def documented_commands() -> list[tuple[str, str, bool]]:
    """(where, command, mention) for every `levels` command line in the docs: the lines of
    fenced blocks (to type; a synopsis line's optional parts left out), then the inline
    spans (mentions)."""
    out = []
    for path in DOCS:
        text = path.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        # a line continued with a backslash is one command
        blocks = [re.sub(r"\\\n\s*", " ", block) for block in blocks]
        lines = [ln.strip() for block in blocks for ln in block.splitlines()]
        spans = [" ".join(s.split()) for s in re.findall(r"`(levels [^`]+)`", text)]
        # a block's line with a description after the command lists the command by name
        typed = [(ln, bool(re.search(r"\S {2,}[^-\s]| / ", ln))) for ln in lines
                 if ln.startswith("levels ")]
        for command, mention in typed + [(s, True) for s in spans]:
            filled = fill(command)
            if filled:
                out.append((path.relative_to(ROOT).as_posix(), filled, mention))
    return sorted(set(out))


def doctor_fix_templates() -> list[str]:
    """Every fix the doctor can print, on any machine, formatted as it would print it here."""
    from cuda_kernels import build

    env = doctor._Env(build)
    methods = {"torch_cuda_install": env.torch_cuda_install(), "triton_install": env.triton_install(),
               "nvcc_fix": env.nvcc_fix(), "no_gpu_fix": env.no_gpu_fix()}
    fixes = [fix.format(**methods) for rules in doctor.LEVEL_FIXES.values() for _, fix in rules]
    fixes += [fix.format(**methods) for _, fix in doctor.COMMON_FIXES]
    report = doctor.diagnose("cpu")
    fixes += [f.fix for f in report.facts] + [r.fix for r in report.levels]
    return fixes + list(methods.values())


def reasons_here() -> list[str]:
    """The reasons the levels give on this machine's CPU, for every component."""
    cpu = torch.device("cpu")
    return [r for name in levels.LEVEL_NAMES for comp in levels.COMPONENTS
            if (r := levels.status(name, cpu, comp))]


def suggested_here() -> list[str]:
    """The `levels` commands this machine's doctor and skip reasons tell a user to run."""
    report = doctor.diagnose("cpu")
    texts = [f.fix for f in report.facts] + [r.fix for r in report.levels] + reasons_here()
    found = [c for t in texts for c in commands_in(t) if _words(c)[1][0] == "levels"]
    return sorted(set(found))


def run_levels(command: str, timeout: float = 600, cwd=None) -> subprocess.CompletedProcess:
    """`command` (a `levels ...` line) in a fresh process, its output captured."""
    env, words = _words(command)
    full = {**os.environ, **env}
    full.pop("COLUMNS", None)
    # the CLI itself, as the installed `levels` script runs it, with this interpreter
    argv = [sys.executable, "-m", "equivalence", *words[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full,
                          cwd=cwd or ROOT)


def assert_no_library_warning(proc: subprocess.CompletedProcess, what: str) -> None:
    for stream in (proc.stdout, proc.stderr):
        lines = [ln for ln in stream.splitlines() if "Warning" in ln]
        assert not lines, f"{what} printed a library's warning:\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------

def test_prose_commands_are_found():
    text = ("run on a machine with an NVIDIA GPU; `levels explain --level cuda` still shows it; "
            "levels doctor --device cuda; for the interpreter: TRITON_INTERPRET=1 levels check "
            "--level triton --device cpu, or pip install 'torch>=2.11,<2.14' (any)")
    assert commands_in(text) == ["levels explain --level cuda", "levels doctor --device cuda",
                                 "TRITON_INTERPRET=1 levels check --level triton --device cpu",
                                 "pip install 'torch>=2.11,<2.14'"]
    assert fill("levels grade --repo path/to/submission [--config grading.json] [--notebooks [PATHS]]") \
        == "levels grade --repo out"
    assert fill("levels X") is None and fill("levels train --amp bf16|fp16") == "levels train --amp bf16"


def test_every_fix_the_doctor_can_suggest_parses(capsys):
    commands = sorted({c for fix in doctor_fix_templates() for c in commands_in(fix)})
    assert any(c.startswith("levels explain") for c in commands)
    assert any(c.startswith("pip install") for c in commands)
    for command in commands:
        assert_parses(command, capsys)


def test_every_skip_reason_command_parses(capsys):
    commands = {c for r in reasons_here() for c in commands_in(r)}
    if not torch.cuda.is_available():
        assert "levels explain --level cuda" in commands  # Level 5's reason on a CPU
    for command in sorted(commands):
        assert_parses(command, capsys)


@pytest.mark.parametrize("where,command,mention", documented_commands())
def test_documented_command_parses(where, command, mention, capsys):
    assert_parses(command, capsys, mention)


def test_the_docs_have_commands_to_check():
    found = documented_commands()
    assert len(found) > 20 and any(c == "levels compare" for _, c, _ in found)
    assert any(c.startswith("levels explain --level cuda") for _, c, _ in found)


@pytest.mark.parametrize("command", suggested_here())
def test_what_this_machine_suggests_runs(command, tmp_path):
    proc = run_levels(command, cwd=tmp_path)
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "usage:" not in proc.stderr
    assert_no_library_warning(proc, command)


# A few documented commands that exercise what warns (TorchScript's deprecation, Inductor,
# the interpreter), each a few seconds to a minute on 2 cores; the README's own first
# command, `levels compare`, is timed in the slow run.
QUICK = ["levels doctor", "levels agree --component lstm",
         "levels check --component layer_norm --level torchscript,compile --dtype fp32",
         "levels explain --component mlp --level torchscript"]


@pytest.mark.parametrize("command", QUICK)
def test_documented_commands_print_no_library_warning(command, tmp_path):
    proc = run_levels(command, cwd=tmp_path)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    assert_no_library_warning(proc, command)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["levels compare --component layer_norm,lstm",
                                     "levels select --component layer_norm",
                                     "levels profile --component mlp --level native,torchscript",
                                     "levels train --model lstm --preset tiny --level all --steps 4",
                                     "levels bench --overhead --component layer_norm"])
def test_longer_documented_commands_print_no_library_warning(command, tmp_path):
    env = f"LEVELS_CACHE_DIR={tmp_path / 'cache'} "
    proc = run_levels(env + command, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_no_library_warning(proc, command)


def test_a_first_auto_call_prints_no_library_warning(tmp_path):
    code = ("import torch, levels\n"
            "x = torch.randn(8, 32, requires_grad=True)\n"
            "w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)\n"
            "levels.auto.layer_norm(x, w, b).sum().backward()\n"
            "print(levels.auto.choice('layer_norm', x, w, b).level)\n")
    env = {**os.environ, "LEVELS_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "levels auto: first layer_norm call" in proc.stderr  # the one line it owes the caller
    assert_no_library_warning(proc, "a first level='auto' call")
    log = tmp_path / "auto.log"
    if log.exists():  # where they went instead
        assert "Warning" in log.read_text()
