"""`levels doctor`: what works on this machine, what does not, why, and the command that fixes it.

    levels doctor                  # this machine, its default device (the GPU if there is one)
    levels doctor --device cpu     # what runs on the CPU
    levels doctor --json env.json  # the same, as JSON (for a bug report)

Two tables. The first lists the facts a student is asked for when something breaks:
Python, torch and the CUDA it was built with, triton (compiled for the GPU or running in
its CPU interpreter), numba; the GPU, its compute capability and bfloat16 support; nvcc,
whether its CUDA matches torch's, ninja; the directories Level 5 builds in and the
compilers cache to. The second lists each level: available or not, the reason, and the fix
as a command to run.

Whether a level runs is the level's own answer (`levels.status`, which calls its
`unavailable_reason`): nothing here decides that again. What the doctor adds is the fix
for reasons that do not carry one (`LEVEL_FIXES`), and the device check in front of it.

It is cheap on purpose: it builds nothing, compiles no kernel and writes nothing (it only
reads where the caches are). The checks take about 0.3 s on a 2-core CPU, on top of the
1.4 s that `import torch` itself costs. Neither Level 3 nor Level 5 imports torch._dynamo
or torch._inductor to answer (another 1.4 s): they apply those libraries' own rules, and
tests hold each rule to the library's answer.

Exit code: 0 when every level can run on the device, 3 when one cannot, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import getpass
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .console import EXIT_NOTHING_RAN, EXIT_OK, EXIT_USAGE, HELP_FORMAT, Sheet, terminal_console


# The oldest versions the project is tested with (pyproject.toml, README).
PYTHON_FLOOR = (3, 11)
TORCH_FLOOR = (2, 11)
TRITON_FLOOR = "3.6.0"

NO_GPU_FIX = ("run on a machine with an NVIDIA GPU; `levels explain --level cuda` still shows the "
              "kernels and their ptxas report here")

EXIT_HELP = """\
exit codes:
  0: every level can run on this device
  2: bad arguments (e.g. --device gpu)
  3: some level cannot run here; the table says why and what to run
"""


@dataclass
class Fact:
    name: str
    value: str
    ok: bool | None  # None: neither good nor bad here (e.g. no GPU on a laptop)
    fix: str = ""


@dataclass
class LevelRow:
    level: str
    number: int
    available: bool
    reason: str = ""  # why not; for an available level, what it lacks (components)
    fix: str = ""


@dataclass
class Report:
    device: str
    facts: list[Fact] = field(default_factory=list)
    levels: list[LevelRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(row.available for row in self.levels) else EXIT_NOTHING_RAN

    def fact(self, name: str) -> Fact:
        return next(f for f in self.facts if f.name == name)

    def level(self, name: str) -> LevelRow:
        return next(row for row in self.levels if row.level == name)

    def to_json(self) -> dict:
        return {"device": self.device, "exit_code": self.exit_code, "seconds": self.seconds,
                "facts": [asdict(f) for f in self.facts], "levels": [asdict(r) for r in self.levels]}


# ---------------------------------------------------------------------------------------
# The environment, read without building or compiling anything.
# ---------------------------------------------------------------------------------------

def _version(package: str) -> str | None:
    """An installed distribution's version, without importing it (importing numba costs
    half a second and tells nothing more)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def _nvidia_driver_here() -> bool:
    """An NVIDIA driver on this machine, whatever torch sees (a CPU-only torch sees no GPU)."""
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def nvcc_cuda_version(nvcc: str | None) -> str | None:
    """'13.0' from `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    if not nvcc:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _NVCC_RELEASE.search(out)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _torch_pinned_triton() -> str | None:
    """The triton version torch's wheel requires (CUDA wheels pin one; Inductor breaks with
    another), or None (the CPU wheel requires none)."""
    for req in importlib.metadata.requires("torch") or ():
        m = re.match(r"(?:pytorch-)?triton\s*==\s*([\w.]+)", req)
        if m:
            return m.group(1)
    return None


class _Env:
    """What the fixes are written from: one place, so every command names the same versions."""

    def __init__(self, build):
        import torch

        self.torch_version = torch.__version__.split("+")[0]
        self.torch_cuda = torch.version.cuda
        self.gpu = torch.cuda.is_available()
        self.driver = _nvidia_driver_here()
        self.nvcc = build.find_nvcc()
        self.nvcc_reason = build.nvcc_available()
        self.nvcc_cuda = nvcc_cuda_version(self.nvcc)
        # read before Level 3's check imports Inductor, which sets this variable itself
        self.inductor_cache_env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

    def torch_cuda_install(self) -> str:
        tag = (f"cu{self.nvcc_cuda.replace('.', '')}" if self.nvcc_cuda else
               "cuXYZ (XYZ: the CUDA version `nvidia-smi` shows, e.g. cu130)")
        return (f"pip install --force-reinstall torch=={self.torch_version} "
                f"--index-url https://download.pytorch.org/whl/{tag}")

    def triton_install(self) -> str:
        if not sys.platform.startswith("linux"):
            return ("Triton ships for Linux only: run on Linux (or WSL2); Levels 1-3 and 5 do not "
                    "need it")
        return f"pip install triton=={_torch_pinned_triton() or TRITON_FLOOR}"

    def nvcc_fix(self) -> str:
        if self.torch_cuda:
            return (f"install the CUDA toolkit matching torch.version.cuda {self.torch_cuda} and put "
                    f"nvcc on PATH, or set CUDA_HOME to the toolkit's directory")
        return ("install the CUDA toolkit and put nvcc on PATH, or set CUDA_HOME (without a GPU, "
                "only `levels explain --level cuda` uses it: the ptxas report)")

    def no_gpu_fix(self) -> str:
        if self.torch_cuda is None and self.driver:
            return self.torch_cuda_install()
        if self.torch_cuda is not None and self.driver:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return ("run `nvidia-smi`: the driver sees no usable GPU" +
                    (f" (CUDA_VISIBLE_DEVICES={visible!r} hides the others: unset it)"
                     if visible is not None else ""))
        return "levels doctor --device cpu (this machine has no GPU), or run on a machine with an NVIDIA GPU"


def _facts(env: _Env, device, build) -> list[Fact]:
    import torch

    import levels.triton as level4  # cheap: triton itself is imported by Level 4's check

    from ..settings import current

    facts = []
    py = sys.version_info
    facts.append(Fact("Python", f"{py.major}.{py.minor}.{py.micro} ({sys.executable})",
                      (py.major, py.minor) >= PYTHON_FLOOR,
                      "" if (py.major, py.minor) >= PYTHON_FLOOR else
                      "python3.11 -m venv .venv && . .venv/bin/activate && pip install "
                      f"torch=={env.torch_version} && pip install -e ."))
    ok = _numbers(torch.__version__)[:2] >= TORCH_FLOOR
    facts.append(Fact("torch", torch.__version__, ok, "" if ok else "pip install torch==2.13.0"))

    if env.torch_cuda is None:
        facts.append(Fact("torch's CUDA", "none: a CPU-only build" +
                          (", on a machine with an NVIDIA driver" if env.driver else ""),
                          False if env.driver else None,
                          env.torch_cuda_install() if env.driver else
                          f"on a machine with an NVIDIA GPU: {env.torch_cuda_install()}"))
    else:
        facts.append(Fact("torch's CUDA", env.torch_cuda, True))

    triton_version = _version("triton") or _version("pytorch-triton")
    facts.append(Fact("triton", triton_version or "not installed", triton_version is not None,
                      "" if triton_version else env.triton_install()))
    if triton_version:
        if level4.INTERPRETED:
            mode = ("interpreted: TRITON_INTERPRET=1 (no GPU), kernels run on CPU tensors, "
                    "slowly; use the tiny sizes")
        else:
            mode = "compiled for the GPU"
        facts.append(Fact("Triton runs", mode, True))
    numba_version = _version("numba")
    facts.append(Fact("numba", numba_version or "not installed", numba_version is not None,
                      "" if numba_version else "pip install 'numba>=0.60'"))

    if env.gpu:
        index = device.index if device.type == "cuda" and device.index is not None else 0
        index = min(index, torch.cuda.device_count() - 1)
        props = torch.cuda.get_device_properties(index)
        facts.append(Fact("GPU", f"cuda:{index} {props.name}, {props.total_memory / 2**30:.0f} GiB "
                                 f"({torch.cuda.device_count()} visible)", True))
        facts.append(Fact("compute capability", f"{props.major}.{props.minor} (Level 5 builds for "
                                                 f"sm_{build.gpu_arch(index)})", True))
        try:
            bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # an older torch without the argument
            bf16 = torch.cuda.is_bf16_supported()
        facts.append(Fact("bfloat16", "yes (native)" if bf16 else
                          "no: this GPU emulates it (compute capability < 8.0); use float16",
                          bf16))
    else:
        why = ("a CPU-only torch" if env.torch_cuda is None else
               "no GPU visible to the CUDA driver")
        facts.append(Fact("GPU", f"none: torch.cuda.is_available() is False ({why})",
                          None if not env.driver else False, "" if not env.driver else env.no_gpu_fix()))
        facts.append(Fact("compute capability", "— (no GPU)", None))
        facts.append(Fact("bfloat16", "— (no GPU; on the CPU torch's own kernels compute it)", None))

    facts.append(Fact("nvcc", f"{env.nvcc} (CUDA {env.nvcc_cuda or '?'})" if env.nvcc else
                      env.nvcc_reason or "not found", env.nvcc_reason is None,
                      "" if env.nvcc_reason is None else env.nvcc_fix()))
    facts.append(_nvcc_vs_torch(env))
    ninja_reason = build.ninja_available()
    ninja = shutil.which("ninja")
    facts.append(Fact("ninja", ninja or "not found", ninja_reason is None,
                      "" if ninja_reason is None else "pip install ninja"))

    if env.gpu:
        directory = build.build_dir(build.gpu_arch(device if device.type == "cuda" else None))
        built = directory.is_dir() and any(directory.rglob("*.so"))
        where = (f"{directory} ({'built: the next call loads it' if built else 'not built yet: '}"
                 f"{'' if built else 'the first Level 5 call builds it, ~20 s on 16 cores'})")
    else:
        where = f"{build.cache_root()} (one build per torch/CUDA/GPU arch; nothing builds without a GPU)"
    facts.append(Fact("Level 5 build dir", where, True))
    facts.append(Fact("levels cache", f"{current().cache_path('')} (measured ceilings, auto's decisions)", True))
    facts.append(Fact("Inductor cache", _inductor_cache(env), True))
    if triton_version:
        facts.append(Fact("Triton cache", _triton_cache(), True))
    return facts


def _nvcc_vs_torch(env: _Env) -> Fact:
    name = "nvcc vs torch's CUDA"
    if env.torch_cuda is None:
        return Fact(name, "torch is a CPU-only build (torch.version.cuda is None): Level 5 needs a "
                          "CUDA build of torch", False if env.driver else None,
                    env.torch_cuda_install() if env.driver else
                    f"on a machine with an NVIDIA GPU: {env.torch_cuda_install()}")
    if env.nvcc_cuda is None:
        return Fact(name, f"cannot compare: {'no nvcc' if not env.nvcc else 'nvcc --version unreadable'}"
                          f" (torch's CUDA: {env.torch_cuda})", False, env.nvcc_fix())
    theirs, ours = _numbers(env.nvcc_cuda), _numbers(env.torch_cuda)
    if theirs[:1] != ours[:1]:
        # torch's extension builder refuses a different major version
        return Fact(name, f"mismatch: nvcc {env.nvcc_cuda}, torch {env.torch_cuda} (the build "
                          f"refuses a different major version)", False, env.nvcc_fix())
    if theirs[:2] != ours[:2]:
        return Fact(name, f"nvcc {env.nvcc_cuda}, torch {env.torch_cuda}: same major version, the "
                          f"build works (torch warns about the minor one)", True)
    return Fact(name, f"match ({env.nvcc_cuda})", True)


def _inductor_cache(env: _Env) -> str:
    if env.inductor_cache_env:
        return env.inductor_cache_env + " ($TORCHINDUCTOR_CACHE_DIR)"
    if "torch._inductor" in sys.modules:  # Level 3's check imported it: ask Inductor itself
        try:  # the function Inductor uses, minus cache_dir()'s makedirs
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
            return default_cache_dir()
        except Exception:  # noqa: BLE001 - a torch that moved it: fall through to its rule
            pass
    # Importing torch._inductor only to ask costs 1.5 s (it imports Dynamo); its rule is this.
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + getpass.getuser())


def _triton_cache() -> str:
    from ..environment import triton_cache_dir

    path, source = triton_cache_dir()  # triton's own answer once Level 4's check imported it
    return f"{path} ($TRITON_CACHE_DIR)" if source == "$TRITON_CACHE_DIR" else str(path)


# ---------------------------------------------------------------------------------------
# The levels: their own answer (levels.status), and the command that fixes it.
# ---------------------------------------------------------------------------------------

# The fix for each reason a level gives without a command in it: level -> (phrase of the
# reason, fix). The levels decide whether they run; this only maps their words to what to
# type. A reason that already says what to do (Level 4's "import levels first, or set
# TRITON_INTERPRET=1") still gets the command here, so the fix column is never empty.
# Fixes are templates over _Env ({torch_cuda_install}, {triton_install}, {nvcc_fix}, {no_gpu_fix}).
LEVEL_FIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "torchscript": (
        ("PYTORCH_JIT=0", "unset PYTORCH_JIT"),
        ("no torch.jit.script", ("use Level 3 (torch.compile); or pip install "
                                 "'torch>=2.11,<2.14' for TorchScript")),
        ("torch.jit.script failed", "use Level 3 (torch.compile); TorchScript is deprecated"),
    ),
    "compile": (
        ("C++ compiler", "sudo apt-get install g++ (or set CXX to your C++ compiler)"),
        ("does not support this Python", ("python3.11 -m venv .venv (a Python torch.compile "
                                          "supports), then install as in the README's quick start")),
        ("Triton is not installed", "{triton_install}"),
    ),
    "triton": (
        ("triton is not installed", "{triton_install}"),
        ("imported before `levels`", "export TRITON_INTERPRET=1, or import levels before triton"),
        ("TRITON_INTERPRET=1 is set", "unset TRITON_INTERPRET (this machine has a GPU)"),
        ("need CUDA tensors", ("levels doctor --device cuda; for the interpreter: "
                               "TRITON_INTERPRET=1 levels check --level triton --device cpu")),
    ),
    "cuda": (
        ("this machine has a GPU", "levels doctor --device cuda"),
        ("CPU-only build", "{torch_cuda_install}"),
        ("needs a CUDA GPU", NO_GPU_FIX),
        # before "nvcc": a failed build's text quotes the compiler
        ("build failed", ("LEVELS_CUDA_VERBOSE=1 python -m cuda_kernels.build (the full compiler "
                          "output), fix the .cu it names, run again")),
        ("registering", "LEVELS_CUDA_VERBOSE=1 python -m cuda_kernels.build"),
        ("nvcc", "{nvcc_fix}"),
        ("ninja", "pip install ninja"),
    ),
}
# Any level asked about a device this machine lacks.
COMMON_FIXES = (("no CUDA", "{no_gpu_fix}"), ("importing", "pip install -e . (from the repository root)"))


def fix_for(level: str, reason: str, env: _Env) -> str:
    for phrase, fix in LEVEL_FIXES.get(level, ()) + COMMON_FIXES:
        if phrase in reason:
            return fix.format(torch_cuda_install=env.torch_cuda_install(),
                              triton_install=env.triton_install(), nvcc_fix=env.nvcc_fix(),
                              no_gpu_fix=env.no_gpu_fix())
    return ""


def _device_reason(device) -> str | None:
    """Why `device` is not on this machine (a fact about the machine, before any level)."""
    import torch

    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        why = ("this torch is a CPU-only build (torch.version.cuda is None)"
               if torch.version.cuda is None else "no GPU is visible to the CUDA driver")
        return f"no CUDA GPU here: torch.cuda.is_available() is False; {why}"
    if device.index is not None and device.index >= torch.cuda.device_count():
        return f"no {device} here: this machine has {torch.cuda.device_count()} GPU(s)"
    return None


def _level_rows(device, env: _Env) -> list[LevelRow]:
    import levels
    from levels.contract import COMPONENTS

    missing_device = _device_reason(device)
    rows = []
    for info in levels.LEVELS:
        reason = missing_device or levels.status(info.name, device)
        # the device's reason is the machine's, not the level's: the common fix answers it
        row = LevelRow(info.name, info.number, reason is None, reason or "",
                       fix_for("" if missing_device else info.name, reason, env) if reason else "")
        if not missing_device:
            # Components a level lacks (Level 5 has no LSTM kernels yet): said, not counted
            # against the exit code, since no command fixes it. Cheap: no kernel compiles.
            lacking = {c: why for c in COMPONENTS
                       if (why := levels.status(info.name, device, c)) and why != reason}
            if lacking:
                note = "; ".join(f"{c}: {why}" for c, why in lacking.items())
                row.reason = f"{row.reason}; {note}" if row.reason else note
        rows.append(row)
    return rows


def parse_device(value: str | None):
    """The device to diagnose. A malformed name is ValueError (exit 2); a valid one this
    machine lacks is diagnosed, not refused: saying why it is missing is the point."""
    from ..environment import parse_device as parse

    return parse(value)


def diagnose(device=None) -> Report:
    """The facts and the levels' availability on `device` (default: the GPU if there is
    one, else the CPU). Builds, compiles and writes nothing; libraries' warnings (TorchScript's
    deprecation notice, raised by Level 2's check) are swallowed: the report says it all."""
    start = time.perf_counter()
    import levels  # noqa: F401 - first: it switches Triton's interpreter on before triton loads
    from cuda_kernels import build

    device = parse_device(None if device is None else str(device))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = _Env(build)
        rows = _level_rows(device, env)  # first: Level 4's check is what imports triton
        facts = [Fact("device", str(device), _device_reason(device) is None,
                      "" if _device_reason(device) is None else env.no_gpu_fix())]
        facts += _facts(env, device, build)
    return Report(str(device), facts, rows, round(time.perf_counter() - start, 3))


# ---------------------------------------------------------------------------------------
# The command.
# ---------------------------------------------------------------------------------------

def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor", formatter_class=HELP_FORMAT,
        help="what works on this machine, what does not, and the command that fixes it",
        description="What works on this machine and why not, in a second or two, building and\n"
                    "compiling nothing: Python, torch and its CUDA, triton (compiled or interpreted),\n"
                    "numba; the GPU, its compute capability and bfloat16 support; nvcc, ninja, and\n"
                    "whether nvcc's CUDA matches torch's; the build and cache directories; and each\n"
                    "level: available, or the reason and the command that fixes it.",
        epilog=EXIT_HELP)
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if there is a GPU, else cpu)")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.set_defaults(run=run)
    return p


_MARK = {True: "[green]ok[/]", False: "[red]✗[/]", None: "[dim]–[/]"}


def render(report: Report, console) -> None:
    from rich.markup import escape

    # the fixes are notes: beside the row when they fit, else whole under the table, so a
    # command is never broken across lines of a cell
    facts = Sheet("levels doctor: this machine", ["", "what", "here"], note="fix",
                  title_justify="left")
    for f in report.facts:
        facts.add_row(_MARK[f.ok], escape(f.name), escape(f.value), note=f.fix)
    facts.print(console)

    rows = Sheet(f"the levels on {report.device}", ["level", "status", "why not"],
                 note="fix (run this)", title_justify="left")
    for r in report.levels:
        status = "[green]available[/]" if r.available else "[red]unavailable[/]"
        rows.add_row(f"{r.number} {r.level}", status, escape(r.reason), note=r.fix)
    rows.print(console)

    blocked = [r.level for r in report.levels if not r.available]
    if blocked:
        console.print(f"{len(blocked)} of {len(report.levels)} levels cannot run on {report.device}: "
                      f"{', '.join(blocked)} (exit 3). Checked in {report.seconds:.1f} s.",
                      markup=False, highlight=False)
    else:
        console.print(f"Every level can run on {report.device}. Checked in {report.seconds:.1f} s.",
                      markup=False, highlight=False)


def run(args, console) -> int:
    try:
        report = diagnose(getattr(args, "device", None))
    except ValueError as exc:
        console.print(f"levels doctor: {exc}", style="red", markup=False)
        return EXIT_USAGE
    render(report, console)
    path = getattr(args, "json", None)
    if path:
        Path(path).write_text(json.dumps(report.to_json(), indent=1) + "\n")
        console.print(f"wrote {path}", markup=False, highlight=False)
    return report.exit_code


def main(argv=None) -> int:
    """`python -m equivalence.doctor`: the same command, outside `levels`."""
    parser = argparse.ArgumentParser(prog="levels")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    return run(args, terminal_console())  # as `levels` does


if __name__ == "__main__":
    sys.exit(main())
