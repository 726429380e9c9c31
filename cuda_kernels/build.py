"""Level 5's build: every `cuda_kernels/*.cu` plus the one C++ binding, compiled once per
torch/CUDA/GPU by torch's JIT extension builder (`torch.utils.cpp_extension.load`, or
`load_inline` with LEVELS_CUDA_BUILDER=inline), loaded as torch custom ops.

    from cuda_kernels import build
    ops = build.ops()                 # builds on first use (30-40 s cold on 16 cores, < 1 s warm)
    ops.layer_norm_fwd(x, w, b, 1e-5, 3)
    build.last_build()                # {"seconds": 0.4, "cached": True, "dir": "..."}
    build.ptxas_report("cuda_kernels/layer_norm.cu")   # registers/smem/spills; nvcc only

Why it is shaped like this (for one small kernel, cold-build time is almost all torch's
headers, measured on the H100: 59 s with torch/extension.h in a .cu, 32 s with pure .cu
files and one binding; for the real kernel files it is nvcc's optimizer):
  * two translation units see torch's headers: `binding_all.cpp` (binding.cpp's prelude
    followed by every `*_binding.cpp` fragment: the kernels' ops) and `autograd_all.cpp`
    (autograd.cpp followed by every `*_autograd.cpp` fragment: the ops a call is, with their
    C++ autograd: its autograd header alone costs g++ as much as the whole binding, so it is
    a unit of its own, compiled beside it); every .cu file is
    pure CUDA and is its own nvcc process, all of them run in parallel by ninja. That is
    cpp_extension.load on the files themselves, the default ("files"): load_inline (same
    machinery: it writes its strings to files and calls the same builder) concatenates all
    CUDA sources into one cuda.cu, so one nvcc process compiles them one after another.
    Measured on the H100 (16 cores; reports/h100-level5.json): cold 174 s "files" vs 207 s
    "inline" with the three part-A files, 59 s "files" with nvcc's --split-compile=0
    (below), and 7.3 s "files" (14.7 s "inline") once gemm.cu's epilogue was written once
    per kernel instead of once per accumulator (store_tile: the file went from ~100 s to
    ~20 s of single-threaded nvcc). LEVELS_CUDA_BUILDER=inline builds the load_inline way;
  * `--split-compile=0`: nvcc runs its optimizer (cicc) and ptxas on one thread per kernel
    group, up to the core count, instead of one thread per file: 174 s -> 59 s cold. The
    kernel files are ladders of templates (version x dtype x epilogue x tile), so one file
    holds many independent kernels for the threads to share;
  * `no_implicit_headers=True` so load_inline adds no <torch/extension.h>, and
    `is_python_module=False`: the ops register through TORCH_LIBRARY, no pybind11 module;
  * the binding's host code at -O1 (it is glue; -O0 vs -O3 host code saved 6 s), and the
    .cu files' host code too: nvcc's -O is the HOST compiler's level. The device code is
    cicc's and ptxas's (-O3 by default whatever -O says): rms_norm.cu's PTX is the same at
    -O0, -O1 and -O3, its cubin the same at -O1 and -O3. The host half of a .cu file (the
    launchers and a stub per kernel) took g++ 4.1 s at -O3 and 2.5 s at -O1 (layer_norm.cu,
    one core), and it runs after the device code, on the longest file's path;
  * attention.cu compiled as two units (attention_backward.cu includes it for the backward's
    kernels: that file says how), because one nvcc process of its ~220 kernels was the cold
    build's longest step: 41 of its 42 s on the H100 (ninja's log; conv_bn.cu, gemm.cu,
    layer_norm.cu and autograd_all.cpp were done by 22-25 s). With both changes, on one H100
    host: 52-53 s before, 32-36 s after; the units now end within seconds of each other, so
    what is left is the CPU's total work (reports/cold-build-and-norm-backward-2026-11-27/);
  * one `-gencode` for the GPU present (sm_90a on an H100: the `a` unlocks wgmma/setmaxnreg),
    with TORCH_CUDA_ARCH_LIST set to the same single arch while building: an arch flag in
    extra_cuda_cflags already makes torch add none of its own (`_get_cuda_arch_flags`
    returns [] when a flag mentions "arch"); the variable makes sure of it.
  * no `--use_fast_math`: it swaps erff/expf/rsqrtf/division for approximate versions
    (and flushes denormals), which moves GELU's erf and softmax's exp by more than the fp32
    bound (1e-5 relative) allows. Kernels that want a fast intrinsic call it by name
    (`__expf`) where its error is accounted for.

Because the .cu files become ONE nvcc unit, file-scope names in two files would clash:
everything in `<stem>.cu` except its `extern "C"` launchers lives in `namespace
levels_<stem> { ... }`, launchers are named `levels_<stem>_<op>` / `levels_<component>_<op>`,
and each file must also compile on its own (tests/test_cuda_build.py compiles every file
alone and all of them together). `#line 1 "<path>"` before each file makes nvcc's errors
name the real file and line. Binding fragments put their helpers in
`namespace levels_cuda_<stem>`.

Safety (pytorch issue 189245: a SIGKILLed build leaves `<build_dir>/lock` behind and every
later build waits on it forever):
  * the build runs under an fcntl.flock on `<build_dir>/levels.flock`, which the kernel
    releases when its holder dies. While we hold it, nobody else can be building here, so a
    torch `lock` file present is stale by construction: it is removed, with one line saying so.
    A second process waits on the flock (saying so after a few seconds, giving up with an
    error after LEVELS_CUDA_BUILD_TIMEOUT seconds, default 600) and then loads the finished
    build: ninja finds nothing to do.
  * a cached library that does not load (truncated by a killed link, a disk error) is
    rebuilt once from scratch, with a message.
  * the build directory is per user (mode 0700) and keyed by torch version, CUDA version,
    Python version and GPU arch, so a change of any of them never reuses a stale library:
    `$LEVELS_CUDA_CACHE/<key>` or `~/.cache/levels/cuda/<key>`. Within it load_inline
    rebuilds whatever source or flag changed (it hashes them; ninja tracks commands).

Build errors surface as `BuildError`: nvcc's / g++'s own `file:line: error:` lines with a
little context, the build directory, the full log's path and the command that rebuilds
verbosely (`LEVELS_CUDA_VERBOSE=1 python -m cuda_kernels.build`), never a ninja traceback.

Nothing here needs a GPU except `load()`: `compile_ptx`, `ptxas_report` and
`nvcc_available` work wherever nvcc is installed (the CI compile test and
`levels explain --level cuda` use them on CPU machines).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
EXT_NAME = "levels_cuda_kernels"  # the .so; the ops live in torch.ops.levels_cuda
OP_NAMESPACE = "levels_cuda"
PRELUDE = "binding.cpp"
FRAGMENT_SUFFIX = "_binding.cpp"
AUTOGRAD = "autograd.cpp"  # the ops users call, autograd in C++: its own unit, torch only
AUTOGRAD_FRAGMENT_SUFFIX = "_autograd.cpp"  # a component's part of that unit (appended to it)

CUDA_FLAGS = ["-O1", "-lineinfo", "-std=c++17", "--split-compile=0"]  # + one -gencode for the GPU
# (-O1: the host code's level; the device code is optimized either way: the docstring says why)
HOST_FLAGS = ["-O1"]
# The macros torch's build adds to every nvcc command (cpp_extension.COMMON_NVCC_FLAGS):
# with them, __half/__nv_bfloat16 have no arithmetic operators and no implicit conversions,
# so kernels convert explicitly (to_f32/from_f32 of common.cuh). compile_ptx/ptxas_report
# pass the same ones, so that a file that compiles in CI compiles in the real build.
TORCH_NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr"]

DEFAULT_TIMEOUT_S = 600.0
WAIT_NOTICE_S = 3.0  # say "waiting" once a lock has been held by someone else this long


class BuildError(RuntimeError):
    """The Level 5 build (or the load of its library) failed; the message is the compiler's."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def extra_nvcc_flags() -> list[str]:
    """$LEVELS_CUDA_NVCC_FLAGS, appended to the kernels' nvcc flags (part of the cache key):
    for experiments such as `--split-compile=0` (nvcc runs cicc/ptxas optimizations on
    several threads) or `-Xptxas=-warn-spills`, without editing this file."""
    import shlex

    return shlex.split(os.environ.get("LEVELS_CUDA_NVCC_FLAGS", ""))


def _verbose() -> bool:
    return os.environ.get("LEVELS_CUDA_VERBOSE", "") not in ("", "0")


# ---------------------------------------------------------------------------------------
# The sources: what gets compiled, assembled exactly as the build sees it.
# ---------------------------------------------------------------------------------------

def kernel_files(kernels_dir: Path = KERNELS_DIR) -> list[Path]:
    """Every .cu file: the set is not 1:1 with components (gemm.cu serves mlp and others)."""
    return sorted(Path(kernels_dir).glob("*.cu"))


def binding_fragments(kernels_dir: Path = KERNELS_DIR) -> list[Path]:
    return sorted(Path(kernels_dir).glob("*" + FRAGMENT_SUFFIX))


def autograd_fragments(kernels_dir: Path = KERNELS_DIR) -> list[Path]:
    return sorted(Path(kernels_dir).glob("*" + AUTOGRAD_FRAGMENT_SUFFIX))


def component_modules(kernels_dir: Path = KERNELS_DIR) -> list[str]:
    """The Python sides of the components present (`cuda_kernels/<component>.py`)."""
    skip = {"__init__", "build", "versions"}
    return sorted(p.stem for p in Path(kernels_dir).glob("*.py")
                  if p.stem not in skip and not p.stem.startswith("_"))


def _with_line(path: Path) -> str:
    # `#line 1 "f"` numbers the *next* line 1 of f: errors then name the real file and line
    # although the compiler sees one concatenated unit.
    return f'#line 1 "{path.resolve()}"\n' + path.read_text() + "\n"


def cpp_source(kernels_dir: Path = KERNELS_DIR) -> str:
    """main.cpp: the binding prelude, then every component's fragment."""
    kernels_dir = Path(kernels_dir)
    parts = [_with_line(kernels_dir / PRELUDE)]
    parts += [_with_line(f) for f in binding_fragments(kernels_dir)]
    return "".join(parts)


def autograd_source(kernels_dir: Path = KERNELS_DIR) -> str:
    """autograd_all.cpp: autograd.cpp (the ops a Level 5 call is, with their autograd; no
    CUDA in it), then every component's `<component>_autograd.cpp` fragment: a component
    added later brings its op in a file of its own, using autograd.cpp's helpers."""
    kernels_dir = Path(kernels_dir)
    parts = [_with_line(kernels_dir / AUTOGRAD)]
    parts += [_with_line(f) for f in autograd_fragments(kernels_dir)]
    return "".join(parts)


def cuda_source(kernels_dir: Path = KERNELS_DIR) -> str:
    """cuda.cu: every .cu file, concatenated. The headers they include are hashed into a
    comment on top, so that editing common.cuh changes this text and forces a rebuild
    (load_inline hashes only the source strings it is given)."""
    kernels_dir = Path(kernels_dir)
    headers = sorted(kernels_dir.glob("*.cuh")) + sorted(kernels_dir.glob("*.h"))
    digest = hashlib.sha256(b"".join(h.read_bytes() for h in headers)).hexdigest()[:16]
    parts = [f"// levels: Level 5 kernels, one unit; headers {digest}\n"]
    parts += [_with_line(f) for f in kernel_files(kernels_dir)]
    return "".join(parts)


_DEF = re.compile(r'\bm\.def\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')


def op_schemas(cpp: str) -> list[str]:
    """The schema strings of every `m.def("...")` in the binding (adjacent literals joined)."""
    return ["".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))) for m in _DEF.finditer(cpp)]


def check_schemas(cpp: str) -> None:
    """Parse every schema in Python before the library is loaded: a bad schema throws from a
    static initializer inside dlopen, which aborts the process instead of raising."""
    import torch

    seen = {}
    for schema in op_schemas(cpp):
        try:
            parsed = torch._C.parse_schema(schema)
        except RuntimeError as exc:
            raise BuildError(f"Level 5 binding: op schema {schema!r} does not parse:\n{exc}") from None
        name = parsed.name.split("::")[-1]
        if name in seen:
            raise BuildError(f"Level 5 binding: op {name!r} is defined twice "
                             f"({seen[name]!r} and {schema!r}); op names are prefixed by "
                             f"their component")
        seen[name] = schema


# ---------------------------------------------------------------------------------------
# Toolchain: nvcc, the GPU's arch, the per-user build directory.
# ---------------------------------------------------------------------------------------

def cuda_home() -> str | None:
    """The CUDA toolkit: $CUDA_HOME/$CUDA_PATH, torch's guess, or /usr/local/cuda."""
    for key in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(key):
            return os.environ[key]
    try:
        from torch.utils import cpp_extension
        if cpp_extension.CUDA_HOME:
            return cpp_extension.CUDA_HOME
    except Exception:  # noqa: BLE001 - torch's guess is a convenience only
        pass
    return "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None


def find_nvcc() -> str | None:
    home = cuda_home()
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def nvcc_available() -> str | None:
    """None if nvcc is here, else why not and how to fix it."""
    if find_nvcc():
        return None
    import torch

    want = f" {torch.version.cuda}" if torch.version.cuda else ""
    return (f"nvcc (the CUDA compiler) was not found (CUDA_HOME={os.environ.get('CUDA_HOME')!r}, "
            f"not on PATH): install the CUDA toolkit{want} matching torch.version.cuda, or set "
            f"CUDA_HOME to the toolkit's directory")


def ninja_available() -> str | None:
    if shutil.which("ninja"):
        return None
    return "ninja was not found: `pip install ninja` (load_inline builds with it)"


def gpu_arch(device=None) -> str:
    """'90a' on an H100 (capability 9.0: wgmma, setmaxnreg need the arch-specific target),
    else the plain 'XY' of the GPU's compute capability."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return "90a" if (major, minor) == (9, 0) else f"{major}{minor}"


def gencode(arch: str) -> str:
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def arch_list(arch: str) -> str:
    """'90a' -> '9.0a' (the TORCH_CUDA_ARCH_LIST spelling)."""
    digits = arch.rstrip("a")
    return f"{digits[:-1]}.{digits[-1]}" + ("a" if arch.endswith("a") else "")


def cache_root() -> Path:
    if os.environ.get("LEVELS_CUDA_CACHE"):
        return Path(os.environ["LEVELS_CUDA_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "levels" / "cuda"


def build_key(arch: str) -> str:
    import torch

    return (f"{torch.__version__}-cu{torch.version.cuda}-py{sys.version_info.major}"
            f"{sys.version_info.minor}-sm{arch}")


def build_dir(arch: str, cache: str | Path | None = None) -> Path:
    """Where `arch`'s build lives under `cache` (default: cache_root())."""
    return (Path(cache).expanduser() if cache else cache_root()) / build_key(arch)


def private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) and refuse one that another user could write into: a
    library loaded from a directory others can write is code they choose."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise BuildError(f"the Level 5 build directory {path} belongs to another user; set "
                         f"LEVELS_CUDA_CACHE to a directory of your own")
    if st.st_mode & 0o022:
        os.chmod(path, st.st_mode & ~0o077)
    return path


# ---------------------------------------------------------------------------------------
# Locking: one builder per directory at a time, never a hang on a dead one's lock.
# ---------------------------------------------------------------------------------------

def _timeout() -> float:
    value = os.environ.get("LEVELS_CUDA_BUILD_TIMEOUT")
    try:
        return float(value) if value else DEFAULT_TIMEOUT_S
    except ValueError:
        raise BuildError(f"LEVELS_CUDA_BUILD_TIMEOUT must be a number of seconds; got {value!r}") from None


@contextlib.contextmanager
def build_lock(directory: Path, timeout: float | None = None, log=_say):
    """Hold `<directory>/levels.flock` (exclusive) for the block; remove a stale torch lock."""
    import fcntl

    directory = Path(directory)
    timeout = _timeout() if timeout is None else timeout
    path = directory / "levels.flock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        start, told = time.monotonic(), False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise BuildError(f"cannot lock {path} ({exc}); file locks may not work on this "
                                     f"file system: set LEVELS_CUDA_CACHE to a local directory") from None
            waited = time.monotonic() - start
            if waited >= timeout:
                raise BuildError(f"gave up after {waited:.0f} s waiting for another process building "
                                 f"Level 5 in {directory} (LEVELS_CUDA_BUILD_TIMEOUT={timeout:g}); "
                                 f"if none is running, remove {path}")
            if not told and waited >= WAIT_NOTICE_S:
                log(f"levels: another process is building Level 5 in {directory}; waiting "
                    f"(up to {timeout:.0f} s)")
                told = True
            time.sleep(0.1)
        stale = directory / "lock"
        if stale.exists():
            # torch's own lock (FileBaton) is a file that exists while someone builds. We hold
            # the flock, so nobody is: a killed build left it, and torch would wait forever.
            stale.unlink()
            log(f"levels: removed {stale}, left behind by an interrupted build")
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


# ---------------------------------------------------------------------------------------
# Error messages: the compiler's own lines, not the build system's.
# ---------------------------------------------------------------------------------------

_NVCC_DIAG = re.compile(r"^(?P<file>\S[^(]*)\((?P<line>\d+)\): (?P<kind>catastrophic error|error|"
                        r"warning|note|remark)(?P<code>[^:]*): (?P<msg>.*)$")
_GCC_DIAG = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<kind>fatal error|"
                       r"error|warning|note): (?P<msg>.*)$")
_OTHER_ERROR = re.compile(r"(ptxas|nvlink|nvcc|fatbinary)\s*(fatal|error)\s*:|undefined reference to|"
                          r"collect2: error|^/usr/bin/ld: |^ld: |^error: |multiple definition of")


def parse_compiler_errors(output: str, max_errors: int = 12) -> list[str]:
    """The error diagnostics in a compiler/ninja log, as 'file:line: error: message' blocks
    (nvcc's `file(line)` normalized), each with its source line and caret, and for template
    code the 'detected during instantiation' line. Notes and warnings are dropped, repeats
    (one per template instantiation) merged."""
    errors: list[list[str]] = []
    current: list[str] | None = None  # the error block being collected
    in_note = False  # inside a note/warning that follows it (its lines are dropped)
    for raw in output.splitlines():
        line = raw.rstrip()
        m = _NVCC_DIAG.match(line) or _GCC_DIAG.match(line)
        if m:
            if "error" in m.group("kind"):
                current = [f"{m.group('file')}:{m.group('line')}: {m.group('kind')}: {m.group('msg')}"]
                errors.append(current)
                in_note = False
            else:
                in_note = True
        elif _OTHER_ERROR.search(line):
            current, in_note = [line.strip()], False
            errors.append(current)
        elif not line.strip() or line.startswith(("FAILED:", "ninja:", "In file included", "In function",
                                                  "In instantiation", "[")):
            current, in_note = None, False  # a block ends at a blank line or the build's own lines
        elif current is not None and "detected during" in line:
            current.append("    " + line.strip())  # which template instantiation failed
        elif current is not None and not in_note and line.startswith((" ", "\t")) and len(current) < 4:
            current.append(line)  # the source line and the caret under it
    seen, unique = set(), []
    for block in errors:
        key = block[0]
        if key not in seen:
            seen.add(key)
            unique.append("\n".join(block))
    if len(unique) > max_errors:
        unique = unique[:max_errors] + [f"... and {len(unique) - max_errors} more error(s)"]
    return unique


def format_build_error(output: str, directory: Path | None = None, arch: str | None = None,
                       log_path: Path | None = None, what: str = "building the Level 5 CUDA kernels",
                       rebuild_hint: bool = True) -> str:
    errors = parse_compiler_errors(output)
    if not errors:  # not a compiler error we recognise: the tail of the log is the best we have
        errors = ["(no compiler error line found; the end of the output:)"] + \
                 [ln for ln in output.strip().splitlines()[-25:]]
    where = f" for sm_{arch}" if arch else ""
    lines = [f"{what}{where} failed:", "", *errors, ""]
    if directory is not None:
        lines.append(f"build directory: {directory}")
    if log_path is not None:
        lines.append(f"full compiler output: {log_path}")
    if rebuild_hint:
        lines.append("rebuild with the full output: LEVELS_CUDA_VERBOSE=1 python -m cuda_kernels.build")
    return "\n".join(lines).rstrip()


# ---------------------------------------------------------------------------------------
# The build itself.
# ---------------------------------------------------------------------------------------

_lock = threading.RLock()
_state: dict = {"library": None, "ops": None, "last": None, "error": None, "error_stamp": None,
                "registration_errors": {}}


def source_stamp(kernels_dir: Path = KERNELS_DIR, extra: str = "") -> str:
    """What a build depends on (sources, flags, toolchain): equal stamps, same library."""
    import torch

    h = hashlib.sha256()
    for part in (cpp_source(kernels_dir), autograd_source(kernels_dir), cuda_source(kernels_dir),
                 " ".join(CUDA_FLAGS + HOST_FLAGS + extra_nvcc_flags()),
                 torch.__version__, str(torch.version.cuda), extra):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class _LoadFailed(Exception):
    """The library was built (or found) but dlopen refused it."""


def _wipe(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.name == "levels.flock":
            continue  # we hold it
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _forget_versions(name: str) -> None:
    # load_inline remembers, per process, which source hash it built under a name, and skips
    # the build when asked again. After we wipe a corrupted directory that memory is wrong.
    from torch.utils import cpp_extension

    entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if isinstance(entries, dict):
        entries.pop(name, None)


# How the kernels reach nvcc (LEVELS_CUDA_BUILDER):
#   "inline": load_inline, every .cu concatenated into ONE cuda.cu (one nvcc process; ninja
#             runs it in parallel with the binding only);
#   "files":  cpp_extension.load on the .cu files themselves: one nvcc process per file,
#             all in parallel with the binding (and errors name the files without #line).
# Both go through the same JIT machinery (load_inline writes its strings to files and calls
# what load calls); they differ only in how many compiler processes ninja can run at once.
BUILDERS = ("inline", "files")


def builder_name(name: str | None = None) -> str:
    """`name` if given (load's `builder` argument), else $LEVELS_CUDA_BUILDER, else "files"."""
    source = "argument 'builder'"
    if name is None:
        name, source = os.environ.get("LEVELS_CUDA_BUILDER", "files"), "LEVELS_CUDA_BUILDER"
    if name not in BUILDERS:
        raise BuildError(f"{source} must be one of {', '.join(BUILDERS)}; got {name!r}")
    return name


def _headers_digest(kernels_dir: Path) -> str:
    headers = sorted(kernels_dir.glob("*.cuh")) + sorted(kernels_dir.glob("*.h"))
    return hashlib.sha256(b"".join(h.read_bytes() for h in headers)).hexdigest()[:16]


def _load_inline_builder(arch: str, kernels_dir: Path = KERNELS_DIR, mode: str = "inline"):
    """The real builder: load_inline (or load, mode "files") into `directory`, returns the
    library's path."""

    def build(directory: Path, verbose: bool) -> str:
        from torch.utils import cpp_extension

        cpp, autograd = cpp_source(kernels_dir), autograd_source(kernels_dir)
        check_schemas(cpp + autograd)
        common = dict(name=EXT_NAME, extra_cflags=list(HOST_FLAGS),
                      extra_cuda_cflags=CUDA_FLAGS + extra_nvcc_flags() + [gencode(arch)],
                      extra_include_paths=[str(kernels_dir)], build_directory=str(directory),
                      verbose=verbose, with_cuda=True, is_python_module=False)
        if mode == "files":
            # load() hashes the source files it is given, not what they include: the headers'
            # digest rides along as a define, so editing common.cuh still rebuilds.
            common["extra_cuda_cflags"].append(f"-DLEVELS_HEADERS={_headers_digest(kernels_dir)}")
            main = Path(directory) / "binding_all.cpp"
            autograd_all = Path(directory) / "autograd_all.cpp"
            for path, text in ((main, cpp), (autograd_all, autograd)):
                if not path.exists() or path.read_text() != text:
                    path.write_text(text)
            build_fn = cpp_extension.load
            kwargs = dict(common, sources=[str(main), str(autograd_all)]
                          + [str(f) for f in kernel_files(kernels_dir)])
        else:
            build_fn = cpp_extension.load_inline
            kwargs = dict(common, cpp_sources=[cpp, autograd], cuda_sources=[cuda_source(kernels_dir)])
            if "no_implicit_headers" in inspect.signature(cpp_extension.load_inline).parameters:
                kwargs["no_implicit_headers"] = True
            elif verbose:
                _say("levels: this torch's load_inline adds <torch/extension.h> (no "
                     "no_implicit_headers): the build is slower")
        _forget_versions(EXT_NAME)
        saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list(arch)
        logger = logging.getLogger("torch.utils.cpp_extension")
        level = logger.level
        if not verbose:
            logger.setLevel(logging.ERROR)
        try:
            path = build_fn(**kwargs)
        except OSError as exc:
            if "load" not in str(exc):  # not torch.ops.load_library's "Could not load this library"
                raise BuildError(f"building Level 5 in {directory} failed: {exc}") from None
            raise _LoadFailed(f"{exc} ({exc.__cause__})" if exc.__cause__ else str(exc)) from exc
        except RuntimeError as exc:
            text = str(exc)
            log_path = Path(directory) / "levels-build.log"
            with contextlib.suppress(OSError):
                log_path.write_text(text)
            raise BuildError(format_build_error(text, directory, arch, log_path)) from None
        finally:
            logger.setLevel(level)
            if saved is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = saved
        return str(path)

    return build


def _library_file(directory: Path) -> Path:
    return Path(directory) / f"{EXT_NAME}.so"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def elf_intact(path: Path) -> bool:
    """Whether every segment and the section table of an ELF64 file lie inside the file.
    A truncated library must be caught *before* dlopen: mapping it and touching a page past
    the end of the file kills the process with SIGBUS, there is no exception to catch."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if len(head) < 64 or head[:4] != b"\x7fELF":
                return False
            if head[4] != 2 or head[5] != 1:  # not ELF64 little-endian: nothing we can check
                return True
            phoff, shoff = struct.unpack_from("<QQ", head, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
            if shoff + shnum * shentsize > size or phoff + phnum * phentsize > size:
                return False
            f.seek(phoff)
            table = f.read(phnum * phentsize)
            for i in range(phnum):
                p_offset, p_filesz = struct.unpack_from("<Q", table, i * phentsize + 8)[0], \
                    struct.unpack_from("<Q", table, i * phentsize + 32)[0]
                if p_offset + p_filesz > size:
                    return False
            return True
    except OSError:
        return False


def _read_record(directory: Path) -> dict:
    try:
        return json.loads((Path(directory) / "levels.stamp").read_text())
    except (OSError, ValueError):
        return {}


def run_build(directory: Path, builder, stamp: str, arch: str = "", timeout: float | None = None,
              verbose: bool = False, log=_say, library: Path | None = None,
              what: str | None = None) -> dict:
    """Build (or find built) and load the library in `directory`, under the lock. A cached
    library that is damaged (checked before loading: a truncated one would crash dlopen) or
    that fails to load is rebuilt once from scratch. `builder(directory, verbose)` does the
    work and returns the library path (tests pass a fake one). Returns last_build()'s dict.
    what: the library's name in messages (default: Level 5's CUDA kernels; Level 4's C++
    host path, triton_kernels/replay.py, is built here too)."""
    name = what or "Level 5"
    starting = (f"levels: building {what} (first time only, ~40 s)..." if what else
                f"levels: building Level 5 CUDA kernels for sm_{arch} (first time only, 30-40 s on 16 cores)...")
    directory = private_dir(directory)
    so = Path(library) if library is not None else _library_file(directory)
    start = time.perf_counter()
    with build_lock(directory, timeout, log):
        waited = time.perf_counter() - start
        record = _read_record(directory)
        if so.exists() and (not elf_intact(so) or record.get("sha256") not in (None, _sha256(so))):
            log(f"levels: the cached {name} library {so} is damaged (truncated or changed since it "
                f"was built); rebuilding it from scratch")
            _wipe(directory)
            record = {}
        before = so.stat().st_mtime_ns if so.exists() else None
        expected_warm = before is not None and record.get("stamp") == stamp
        if not expected_warm:
            log(starting)
        t0 = time.perf_counter()
        try:
            path = builder(directory, verbose)
        except _LoadFailed as exc:
            log(f"levels: the {name} library in {directory} does not load ({exc}); "
                f"rebuilding it from scratch")
            _wipe(directory)
            before = None
            try:
                path = builder(directory, verbose)
            except _LoadFailed as again:
                hint = ""
                if "undefined symbol" in str(again):
                    hint = ("\n(an undefined symbol: a launcher declared in a *_binding.cpp fragment "
                            "has no definition in any .cu file, or its name or signature differ)")
                raise BuildError(f"the {name} library built in {directory} does not load: "
                                 f"{again}{hint}") from None
        seconds = time.perf_counter() - t0
        path = Path(path)
        after = path.stat().st_mtime_ns if path.exists() else None
        cached = before is not None and after == before
        record = {"stamp": stamp, "sha256": _sha256(path) if path.exists() else None}
        (directory / "levels.stamp").write_text(json.dumps(record))
        if not expected_warm or not cached:
            log(f"levels: done in {seconds:.0f} s")
    return {"seconds": round(seconds, 3), "cached": cached, "dir": str(directory), "library": str(path),
            "arch": arch, "waited_for_lock_s": round(waited, 3)}


def _register_components(kernels_dir: Path = KERNELS_DIR) -> dict[str, str]:
    """Import every cuda_kernels/<component>.py and call its _register() (fake implementations
    of its kernel ops; autograd is C++, autograd_binding.cpp).
    A component whose registration fails is reported (levels.cuda marks it unavailable)
    instead of taking the others down."""
    errors = {}
    for name in component_modules(kernels_dir):
        try:
            module = importlib.import_module(f"{__package__ or 'cuda_kernels'}.{name}")
            register = getattr(module, "_register", None)
            if register is not None:
                register()
        except Exception as exc:  # noqa: BLE001 - reported per component
            errors[name] = f"{type(exc).__name__}: {exc}"
    return errors


def failure() -> str | None:
    """The BuildError text of a failed build in this process, while the sources that failed
    are unchanged (edit a .cu and the next call tries again)."""
    with _lock:
        if _state["error"] is None:
            return None
        try:
            same = source_stamp() == _state["error_stamp"]
        except Exception:  # noqa: BLE001 - a file vanished mid-edit: report the old error
            same = True
        return _state["error"] if same else None


def registration_errors() -> dict[str, str]:
    return dict(_state["registration_errors"])


def load(device=None, cache: str | Path | None = None, builder: str | None = None) -> str:
    """Build (first time) and load the Level 5 library into this process; returns its path.
    Thread-safe; later calls return at once. Raises BuildError with the compiler's message.
    cache, builder: where to build and how (default: $LEVELS_CUDA_CACHE, cache_root(), and
    $LEVELS_CUDA_BUILDER): a script that built in child processes loads that build so,
    without writing them into its own environment."""
    with _lock:
        if _state["library"] is not None:
            return _state["library"]
        import torch

        if not torch.cuda.is_available():
            raise BuildError("Level 5 builds for the GPU present, and there is none "
                             "(torch.cuda.is_available() is False)")
        for reason in (nvcc_available(), ninja_available()):
            if reason:
                raise BuildError(reason)
        previous = failure()
        if previous is not None:
            raise BuildError(previous)
        arch = gpu_arch(device)
        stamp = source_stamp(extra=arch)
        try:
            mode = builder_name(builder)
            info = run_build(build_dir(arch, cache) / mode, _load_inline_builder(arch, mode=mode), stamp,
                             arch, verbose=_verbose())
        except BuildError as exc:
            _state["error"], _state["error_stamp"] = str(exc), source_stamp()
            raise
        _state["last"], _state["error"] = info, None
        _state["library"] = info["library"]
        _state["registration_errors"] = _register_components()
        return _state["library"]


def ops():
    """torch.ops.levels_cuda, with the library loaded (built on first use)."""
    import torch

    load()
    return getattr(torch.ops, OP_NAMESPACE)


def last_build() -> dict | None:
    """{'seconds', 'cached', 'dir', ...} of this process's build/load, None before it."""
    return None if _state["last"] is None else dict(_state["last"])


def loaded() -> bool:
    return _state["library"] is not None


# ---------------------------------------------------------------------------------------
# nvcc alone (no GPU, no torch build): PTX for CI, ptxas reports for explain.
# ---------------------------------------------------------------------------------------

def _normalize_arch(arch: str | int) -> str:
    arch = str(arch).lower().removeprefix("sm_").removeprefix("compute_").replace(".", "")
    if not re.fullmatch(r"\d{2,3}a?", arch):
        raise ValueError(f"argument 'arch' must look like 'sm_90a', '90' or '8.0'; got {arch!r}")
    return arch


def _nvcc(args: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError(nvcc_available())
    return subprocess.run([nvcc, *args], capture_output=True, text=True, cwd=cwd)


def _source_file(source, tmp: str) -> Path:
    """A path as is; source text written to a file (kept next to nothing else)."""
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source
                                    and source.endswith(".cu")):
        return Path(source).resolve()
    path = Path(tmp) / "source.cu"
    path.write_text(source)
    return path


def compile_ptx(source, arch: str | int = "90", include_dirs=(), extra_flags=()) -> str:
    """PTX of one .cu file (a path) or source text, compiled as the build compiles it (same
    macros, -O3, -std=c++17, -I cuda_kernels). Raises BuildError with the compiler's lines."""
    arch = _normalize_arch(arch)
    with tempfile.TemporaryDirectory(prefix="levels-ptx-") as tmp:
        src = _source_file(source, tmp)
        out = Path(tmp) / "out.ptx"
        flags = [*TORCH_NVCC_FLAGS, *CUDA_FLAGS, f"-I{KERNELS_DIR}", *[f"-I{d}" for d in include_dirs],
                 *extra_flags, "--ptx", f"-arch=compute_{arch}", "-o", str(out), str(src)]
        proc = _nvcc(flags)
        if proc.returncode != 0:
            raise BuildError(format_build_error(proc.stdout + proc.stderr, arch=arch, rebuild_hint=False,
                                                what=f"compiling {src.name} to PTX"))
        return out.read_text()


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_BARRIERS = re.compile(r"used (\d+) barriers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas(output: str) -> list[dict]:
    """`ptxas -v` lines -> one dict per kernel (entry function), in the order compiled."""
    kernels: dict[str, dict] = {}
    frames: dict[str, tuple] = {}
    entry = props_for = None
    for line in output.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = m.group(1)
            kernels[entry] = {"mangled": entry, "arch": m.group(2), "registers": None,
                              "shared_bytes": 0, "barriers": 0, "stack_bytes": 0,
                              "spill_stores": 0, "spill_loads": 0}
        elif m := _PTXAS_PROPS.search(line):
            props_for = m.group(1)
        elif m := _PTXAS_FRAME.search(line):
            if props_for is not None:
                frames[props_for] = tuple(int(g) for g in m.groups())
        elif (m := _PTXAS_USED.search(line)) and entry is not None:
            k = kernels[entry]
            k["registers"] = int(m.group(1))
            if b := _PTXAS_BARRIERS.search(line):
                k["barriers"] = int(b.group(1))
            if s := _PTXAS_SMEM.search(line):
                k["shared_bytes"] = int(s.group(1))
            if c := _PTXAS_CMEM.search(line):
                k["cmem_bytes"] = int(c.group(1))
    for name, k in kernels.items():
        if name in frames:
            k["stack_bytes"], k["spill_stores"], k["spill_loads"] = frames[name]
    return list(kernels.values())


def demangle(names: list[str]) -> list[str]:
    """cu++filt (CUDA's) or c++filt (binutils: the same Itanium ABI); names as they are
    when neither is installed."""
    home = cuda_home()
    tool = next((t for t in ([os.path.join(home, "bin", "cu++filt")] if home else []) +
                 [shutil.which("cu++filt"), shutil.which("c++filt")] if t and os.access(t, os.X_OK)),
                None)
    if tool is None or not names:
        return list(names)
    try:
        proc = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                              timeout=30)
        out = proc.stdout.splitlines()
        return out if proc.returncode == 0 and len(out) == len(names) else list(names)
    except (OSError, subprocess.SubprocessError):
        return list(names)


_ptxas_memo: dict[str, list[dict]] = {}


def ptxas_report(source_file, arch: str | int = "90a") -> list[dict]:
    """Per kernel of one .cu file: registers, shared memory, barriers, stack, spill stores and
    loads, as ptxas reports them for `arch` (sm_90a by default: the H100). Needs nvcc only.
    Cached by the hash of the sources, flags and nvcc (in memory and in the cache dir)."""
    arch = _normalize_arch(arch)
    source_file = Path(source_file).resolve()
    text = source_file.read_text()
    headers = sorted(set(source_file.parent.glob("*.cuh")) | set(KERNELS_DIR.glob("*.cuh")))
    flags = [*TORCH_NVCC_FLAGS, *CUDA_FLAGS, f"-I{KERNELS_DIR}", f"-I{source_file.parent}", "-Xptxas",
             "-v", "--cubin", gencode(arch)]
    key = hashlib.sha256("\0".join([text, *[h.read_text() for h in headers], " ".join(flags),
                                    str(find_nvcc())]).encode()).hexdigest()[:24]
    if key in _ptxas_memo:
        return [dict(k) for k in _ptxas_memo[key]]
    disk = cache_root() / "ptxas" / f"{key}.json"
    with contextlib.suppress(OSError, ValueError):
        report = json.loads(disk.read_text())
        _ptxas_memo[key] = report
        return [dict(k) for k in report]
    with tempfile.TemporaryDirectory(prefix="levels-ptxas-") as tmp:
        proc = _nvcc([*flags, "-o", str(Path(tmp) / "out.cubin"), str(source_file)])
    if proc.returncode != 0:
        raise BuildError(format_build_error(proc.stdout + proc.stderr, arch=arch, rebuild_hint=False,
                                            what=f"compiling {source_file.name} for the ptxas report"))
    report = parse_ptxas(proc.stdout + proc.stderr)
    for k, name in zip(report, demangle([k["mangled"] for k in report])):
        k["kernel"] = name
    _ptxas_memo[key] = report
    with contextlib.suppress(OSError, BuildError):
        private_dir(disk.parent)
        disk.write_text(json.dumps(report, indent=1))
    return [dict(k) for k in report]


def format_ptxas(report: list[dict]) -> list[str]:
    """One line per kernel: what a reader scans for (registers, smem, spills)."""
    lines = []
    for k in report:
        spill = k["spill_stores"] + k["spill_loads"]
        lines.append(f"{k.get('kernel', k['mangled'])}: {k['registers']} registers, "
                     f"{k['shared_bytes']} B shared, {k['barriers']} barriers, {k['stack_bytes']} B stack, "
                     f"spills {k['spill_stores']} B stored / {k['spill_loads']} B loaded"
                     + ("  <-- SPILLS" if spill else ""))
    return lines


def _main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cuda_kernels.build",
                                     description="Build and load the Level 5 kernels (GPU), or "
                                                 "print ptxas reports (nvcc only).")
    parser.add_argument("--ptxas", nargs="*", metavar="FILE.cu",
                        help="print the ptxas report of these files (default: all) instead of building")
    parser.add_argument("--arch", default="90a", help="arch of --ptxas (default 90a)")
    args = parser.parse_args(argv)
    if args.ptxas is not None:
        for f in args.ptxas or kernel_files():
            print(f"# {f}")
            for line in format_ptxas(ptxas_report(f, args.arch)):
                print("  " + line)
        return 0
    try:
        load()
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(last_build() | {"registration_errors": registration_errors()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
