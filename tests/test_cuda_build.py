"""Level 5's build, loader and level module.

On any machine: every .cu compiles with nvcc (alone and as the one unit the loader makes),
the binding passes g++ against torch's headers, compiler output becomes file:line
messages, the lock survives a killed build and two builders, a damaged cache is rebuilt,
the level explains why it cannot run and what its kernels are. Marked `gpu`: the real
build, cold and warm, two processes at once, a torch.compile'd graph and a levels.nn layer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import levels
from cuda_kernels import build

ROOT = Path(__file__).resolve().parents[1]
NVCC = build.nvcc_available()
needs_nvcc = pytest.mark.skipif(NVCC is not None, reason=f"needs nvcc: {NVCC}")
CU_FILES = build.kernel_files()
COMPONENTS_WITH_KERNELS = [c for c in levels.COMPONENTS if levels.get("cuda").has_kernels(c)]
FAKE_LIBRARY = Path(torch.__file__).parent / "lib" / "libtorch_global_deps.so"  # a small real ELF


# ------------------------------------------------------------------ nvcc, g++ (CI) --

# sm_80 here, each file alone (a file must compile without the others, and a Hopper-only
# rung must compile out for an older GPU); sm_90 in the one-unit test below, which compiles
# every file again (one sm_90 pass per file is enough: attention.cu alone takes ~30 s).
@needs_nvcc
@pytest.mark.parametrize("arch", ["80"])
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_every_cu_file_compiles_alone(cu, arch):
    ptx = build.compile_ptx(cu, arch)
    assert ".entry" in ptx, f"{cu.name} compiled to PTX without a single kernel"


@needs_nvcc
def test_all_cu_files_compile_as_the_one_unit_the_loader_builds():
    # The loader concatenates every .cu into one nvcc unit: a name defined at file scope in
    # two files (instead of inside `namespace levels_<stem>`) is a redefinition here.
    if not CU_FILES:
        pytest.skip("no .cu file yet")
    ptx = build.compile_ptx(build.cuda_source(), "90")
    assert ptx.count(".entry") >= len(CU_FILES)


def _torch_includes(tmp_path: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    dirs = include_paths()
    # CPU wheels lack this one generated header of c10/cuda; the syntax check needs only
    # its macro (shim for this test only, never for a build).
    if not any((Path(d) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for d in dirs):
        shim = tmp_path / "shim" / "c10" / "cuda" / "impl"
        shim.mkdir(parents=True)
        (shim / "cuda_cmake_macros.h").write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
        dirs = [str(tmp_path / "shim"), *dirs]
    return dirs


def test_binding_and_fragments_pass_gxx_syntax_check(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++")
    home = build.cuda_home()
    if home is None or not (Path(home) / "include" / "cuda_runtime.h").exists():
        pytest.skip(f"needs the CUDA headers (cuda_runtime.h) of a toolkit; CUDA_HOME={home}")
    includes = [f"-I{d}" for d in _torch_includes(tmp_path)]
    for name, text in (("main.cpp", build.cpp_source()), ("autograd.cpp", build.autograd_source())):
        source = tmp_path / name
        source.write_text(text)
        cmd = [gxx, "-std=c++17", "-fsyntax-only", *includes,
               f"-I{Path(home) / 'include'}", f"-I{build.KERNELS_DIR}", str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, build.format_build_error(
            proc.stdout + proc.stderr, rebuild_hint=False, what=f"g++ -fsyntax-only of {name}")


def test_every_op_schema_parses_and_is_defined_once():
    every = build.cpp_source() + build.autograd_source()
    build.check_schemas(every)
    names = [torch._C.parse_schema(s).name for s in build.op_schemas(every)]
    assert len(names) == len(set(names))
    with pytest.raises(build.BuildError, match="defined twice"):
        build.check_schemas('m.def("a_fwd(Tensor x) -> Tensor"); m.def("a_fwd(Tensor y) -> Tensor");')
    with pytest.raises(build.BuildError, match="does not parse"):
        build.check_schemas('m.def("a_fwd(Tensor x -> Tensor");')


def test_sources_carry_line_directives_and_header_hash(tmp_path):
    (tmp_path / "common.cuh").write_text("#pragma once\n")
    (tmp_path / "a.cu").write_text("// a\n")
    first = build.cuda_source(tmp_path)
    assert f'#line 1 "{(tmp_path / "a.cu").resolve()}"' in first
    (tmp_path / "common.cuh").write_text("#pragma once\n// edited\n")
    assert build.cuda_source(tmp_path) != first  # a header edit rebuilds


# ------------------------------------------------------------- error messages --

# Real output of nvcc 13.0 (`nvcc --ptx` of a file with two errors, the second in a template).
NVCC_OUTPUT = textwrap.dedent("""\
    /work/main/cuda_kernels/bad.cu(3): error: identifier "undefined_thing" is undefined
      __attribute__((global)) void k(float* x) { x[threadIdx.x] = undefined_thing; }
                                                                  ^

    /work/main/cuda_kernels/bad.cu(4): error: no operator "+" matches these operands
                operand types are: __half + __half
      template <typename T> __attribute__((global)) void k2(T* x, T a) { x[0] = x[1] + a; }
                                                                                     ^
    /usr/local/cuda-13.0/bin/../targets/x86_64-linux/include/cuda_bf16.hpp(353): note #3322-D: number of parameters of function "operator+(const __nv_bfloat162 &)" does not match the call
      __attribute__((host)) __attribute__((device)) __nv_bfloat162 operator+(const __nv_bfloat162 &h) { return h; }
                                                                                                             ^
    /work/main/cuda_kernels/bad.cu(4): note #3328-D: built-in operator+(<promoted arithmetic>, <promoted arithmetic>) does not match because argument #1 does not match parameter
      template <typename T> __attribute__((global)) void k2(T* x, T a) { x[0] = x[1] + a; }
                                                                                     ^
              detected during instantiation of "void levels_bad::k2(T *, T) [with T=__half]" at line 6

    2 errors detected in the compilation of "cat.cu".
    """)

# Real output of load_inline (ninja) for a binding with an error, as its RuntimeError says it.
NINJA_GXX_OUTPUT = textwrap.dedent("""\
    Error building extension 'try_ext': [1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=try_ext -fPIC -std=c++20 -O1 -c /tmp/lt/dir/main.cpp -o main.o
    FAILED: [code=1] main.o
    c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=try_ext -fPIC -std=c++20 -O1 -c /tmp/lt/dir/main.cpp -o main.o
    /work/x_binding.cpp: In function 'at::Tensor twice(const at::Tensor&)':
    /work/x_binding.cpp:4:54: error: 'y' was not declared in this scope
    ninja: build stopped: subcommand failed.
    """)


def test_parser_turns_nvcc_output_into_file_line_errors():
    errors = build.parse_compiler_errors(NVCC_OUTPUT)
    assert len(errors) == 2
    assert errors[0].startswith('/work/main/cuda_kernels/bad.cu:3: error: identifier "undefined_thing"')
    assert "undefined_thing; }" in errors[0] and "^" in errors[0]  # the source line and caret
    assert errors[1].startswith("/work/main/cuda_kernels/bad.cu:4: error: no operator")
    assert "[with T=__half]" in errors[1]  # which instantiation
    assert "note" not in "".join(errors) and "cuda_bf16.hpp" not in "".join(errors)


def test_parser_turns_ninja_gxx_output_into_file_line_errors():
    message = build.format_build_error(NINJA_GXX_OUTPUT, Path("/tmp/dir"), "90a")
    assert "/work/x_binding.cpp:4: error: 'y' was not declared in this scope" in message
    assert "FAILED" not in message and "c++ -MMD" not in message and "Traceback" not in message
    assert "/tmp/dir" in message and "LEVELS_CUDA_VERBOSE=1" in message


@needs_nvcc
def test_a_broken_kernel_is_reported_with_its_own_file_and_line(tmp_path):
    bad = tmp_path / "broken.cu"
    bad.write_text('#include "common.cuh"\nnamespace levels_broken {\n'
                   '__global__ void k(float* x) { x[0] = not_declared; }\n}\n')
    with pytest.raises(build.BuildError) as info:
        build.compile_ptx(bad, "90")
    assert f'{bad}:3: error: identifier "not_declared" is undefined' in str(info.value)
    # the same through the loader's concatenation (#line directives)
    with pytest.raises(build.BuildError) as info:
        build.compile_ptx(build.cuda_source(tmp_path), "90")
    assert f"{bad.resolve()}:3: error:" in str(info.value)


@needs_nvcc
def test_ptxas_report_has_registers_smem_spills_per_kernel(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(textwrap.dedent("""\
        #include "common.cuh"
        namespace levels_k {
        template <typename T> __global__ void sum_v1(const T* x, float* y, int64_t n) {
          __shared__ float scratch[32];
          float v = 0.f;
          for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += to_f32(x[i]);
          v = block_sum(v, scratch);
          if (threadIdx.x == 0) y[0] = v;
        }
        template __global__ void sum_v1<float>(const float*, float*, int64_t);
        }
        """))
    report = build.ptxas_report(src)
    assert len(report) == 1
    k = report[0]
    assert "sum_v1" in k["kernel"] and k["registers"] > 0 and k["shared_bytes"] == 128
    assert k["spill_stores"] == 0 and k["barriers"] >= 1
    assert build.ptxas_report(src) == report  # cached


def test_parse_ptxas_fixture():
    out = textwrap.dedent("""\
        ptxas info    : Compiling entry function '_ZN9levels_ok5spillEPfi' for 'sm_90a'
        ptxas info    : Function properties for _ZN9levels_ok5spillEPfi
            1024 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 40 registers, used 0 barriers, 1024 bytes cumulative stack size
        """)
    (k,) = build.parse_ptxas(out)
    assert (k["registers"], k["stack_bytes"], k["spill_stores"], k["spill_loads"]) == (40, 1024, 8, 12)
    assert "SPILLS" in build.format_ptxas([k])[0]


# ------------------------------------------------- locks, stale locks, damaged caches --

def _fake_builder(calls: list | None = None, delay: float = 0.0):
    """Stands in for load_inline: takes torch's own `lock` like it does, 'compiles' (copies a
    real ELF library) unless the library is already there (ninja's no-op)."""
    from torch.utils.file_baton import FileBaton

    def builder(directory: Path, verbose: bool) -> str:
        baton = FileBaton(str(directory / "lock"))
        assert baton.try_acquire(), "torch's lock file is still there: load_inline would wait forever"
        try:
            lib = directory / f"{build.EXT_NAME}.so"
            if not lib.exists():
                time.sleep(delay)
                shutil.copy(FAKE_LIBRARY, lib)
                (directory / "object.o").write_text("compiled")
            if calls is not None:
                calls.append(sorted(p.name for p in directory.iterdir()))
            return str(lib)
        finally:
            baton.release()

    return builder


def test_stale_torch_lock_is_removed_with_a_message(tmp_path):
    (tmp_path / "lock").write_text("")  # what a SIGKILLed build leaves behind
    said = []
    info = build.run_build(tmp_path, _fake_builder(), "stamp", "90a", timeout=10, log=said.append)
    assert not (tmp_path / "lock").exists()
    assert any("removed" in s and "lock" in s for s in said)
    assert info["cached"] is False and info["dir"] == str(tmp_path)
    said.clear()
    info = build.run_build(tmp_path, _fake_builder(), "stamp", "90a", timeout=10, log=said.append)
    assert info["cached"] is True and said == []  # warm: silent


def test_status_lines_when_building(tmp_path):
    said = []
    build.run_build(tmp_path, _fake_builder(), "stamp", "90a", timeout=10, log=said.append)
    assert said[0].startswith("levels: building Level 5 CUDA kernels for sm_90a (first time only")
    assert said[-1].startswith("levels: done in")


def test_waiting_for_another_builder_says_so_and_times_out(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "WAIT_NOTICE_S", 0.1)
    said = []
    with build.build_lock(tmp_path, timeout=10, log=said.append):
        start = time.monotonic()
        with pytest.raises(build.BuildError, match="gave up after"):
            with build.build_lock(tmp_path, timeout=0.5, log=said.append):
                pass
        assert time.monotonic() - start < 5
    assert any("another process is building Level 5" in s for s in said)
    with build.build_lock(tmp_path, timeout=1, log=said.append):  # released: free again
        pass


def test_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("LEVELS_CUDA_BUILD_TIMEOUT", "7")
    assert build._timeout() == 7.0
    monkeypatch.setenv("LEVELS_CUDA_BUILD_TIMEOUT", "soon")
    with pytest.raises(build.BuildError, match="LEVELS_CUDA_BUILD_TIMEOUT"):
        build._timeout()


TWO_BUILDERS = """
import json, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from pathlib import Path
from cuda_kernels import build
from test_cuda_build import _fake_builder
info = build.run_build(Path({dir!r}), _fake_builder(delay=2.0), "stamp", "90a", timeout=60)
print(json.dumps(info))
"""


def test_two_processes_building_at_once_both_succeed(tmp_path):
    code = TWO_BUILDERS.format(root=str(ROOT), tests=str(ROOT / "tests"), dir=str(tmp_path / "b"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["cached"] for r in results) == [False, True]  # one built, one loaded it


def test_damaged_cache_is_rebuilt_from_scratch(tmp_path):
    calls, said = [], []
    build.run_build(tmp_path, _fake_builder(calls), "stamp", "90a", timeout=10, log=said.append)
    lib = tmp_path / f"{build.EXT_NAME}.so"
    lib.write_bytes(lib.read_bytes()[:2000])  # truncated, as by a build killed while linking
    assert not build.elf_intact(lib) and build.elf_intact(FAKE_LIBRARY)
    said.clear()
    info = build.run_build(tmp_path, _fake_builder(calls), "stamp", "90a", timeout=10, log=said.append)
    assert any("damaged" in s for s in said) and info["cached"] is False
    assert build.elf_intact(lib)


def test_library_that_does_not_load_is_rebuilt_once_then_reported(tmp_path):
    attempts, said = [], []

    def flaky(directory, verbose):
        attempts.append(1)
        if len(attempts) == 1:
            raise build._LoadFailed("file too short")
        return _fake_builder()(directory, verbose)

    build.run_build(tmp_path / "a", flaky, "stamp", "90a", timeout=10, log=said.append)
    assert len(attempts) == 2 and any("does not load" in s for s in said)

    def broken(directory, verbose):
        raise build._LoadFailed("undefined symbol: levels_layer_norm_fwd")

    with pytest.raises(build.BuildError, match="undefined symbol"):
        build.run_build(tmp_path / "b", broken, "stamp", "90a", timeout=10, log=said.append)


def test_build_dir_is_private_and_keyed(tmp_path, monkeypatch):
    monkeypatch.setenv("LEVELS_CUDA_CACHE", str(tmp_path / "cache"))
    d = build.build_dir("90a")
    assert d.parent == tmp_path / "cache"
    assert torch.__version__ in d.name and d.name.endswith("-sm90a") and f"cu{torch.version.cuda}" in d.name
    build.private_dir(d)
    assert d.stat().st_mode & 0o077 == 0
    assert build.arch_list("90a") == "9.0a" and build.arch_list("86") == "8.6"
    assert build.gencode("90a") == "-gencode=arch=compute_90a,code=sm_90a"


# ------------------------------------------------------ the level on a CPU machine --

@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
@pytest.mark.parametrize("component", levels.COMPONENTS)
def test_level5_without_gpu_says_why(component):
    reason = levels.status("cuda", "cpu", component)
    if component in COMPONENTS_WITH_KERNELS:
        assert "needs a CUDA GPU" in reason and "levels explain --level cuda" in reason
    else:
        assert reason == f"Level 5 has no {component} kernels yet"
    assert not build.loaded()  # answering built nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
def test_check_cuda_on_cpu_skips_with_reason_exit_3(capsys):
    from equivalence.cli import EXIT_NOTHING_RAN, main

    assert main(["check", "--level", "cuda", "--component", "layer_norm,attention"]) == EXIT_NOTHING_RAN
    out = capsys.readouterr().out
    assert "skip" in out and "needs a CUDA GPU" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
def test_calling_level5_without_gpu_raises_the_reason():
    x = torch.randn(2, 8)
    with pytest.raises(NotImplementedError, match="needs a CUDA GPU"):
        levels.get("cuda").layer_norm(x, torch.ones(8), torch.zeros(8))
    with pytest.raises(ValueError, match="argument 'weight'"):  # the contract comes first
        levels.get("cuda").layer_norm(x, torch.ones(7), torch.zeros(8))


@pytest.mark.parametrize("component", COMPONENTS_WITH_KERNELS or ["layer_norm"])
def test_explain_shows_ladder_kernels_and_ptxas(component):
    cuda = levels.get("cuda")
    if not cuda.has_kernels(component):
        pytest.skip(f"no {component} kernels yet")
    text = cuda.explain(component, "cpu")
    files = cuda.kernel_files(component)
    assert files, f"{component} has no .cu file that explain can find"
    for f in files:
        assert f"cuda_kernels/{f.name}" in text
    assert "# ---- kernel " in text and "__global__" in text
    if NVCC is not None:
        assert "ptxas report unavailable" in text and "nvcc" in text
    else:
        assert "ptxas:" in text and "registers" in text and "spills" in text


def test_explain_of_a_component_without_kernels():
    cuda = levels.get("cuda")
    missing = [c for c in levels.COMPONENTS if not cuda.has_kernels(c)]
    if not missing:
        pytest.skip("every component has kernels")
    assert cuda.explain(missing[0], "cpu") == f"Level 5 has no {missing[0]} kernels yet"


def test_kernel_extraction_ignores_comments_and_strings():
    cuda = levels.get("cuda")
    text = textwrap.dedent("""\
        // demo.cu: v1 naive, v2 { a brace in a comment
        #include "common.cuh"
        namespace levels_demo {
        // v1: one thread per row
        template <typename T>
        __global__ void fwd_v1(const T* x, T* y) { if (x) { y[0] = x[0]; } const char* s = "}"; }
        __global__ void __launch_bounds__(128) fwd_v2(float* x) { x[0] = '{'; }
        __global__ void declared_only(float* x);
        }
        // extern "C" int levels_demo_fake(int);
        extern "C" int levels_demo_fwd(int dtype, cudaStream_t s) { return 0; }
        """)
    kernels = cuda.kernels_in(text)
    assert [n for n, _ in kernels] == ["fwd_v1", "fwd_v2"]
    assert kernels[0][1].startswith("// v1: one thread per row\ntemplate") and kernels[0][1].endswith('"}"; }')
    assert cuda.launchers_in(text) == ["levels_demo_fwd"]
    assert cuda.opening_comment(text).startswith("// demo.cu")


# ----------------------------------------------------------------- on the GPU --

BUILD_ONCE = """
import json, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from cuda_kernels import build
build.load()
print(json.dumps(build.last_build() | {{"total_s": time.perf_counter() - t0,
                                         "registration_errors": build.registration_errors()}}))
"""


def _build_in(cache: Path, n: int = 1) -> list[dict]:
    env = dict(os.environ, LEVELS_CUDA_CACHE=str(cache))
    code = BUILD_ONCE.format(root=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        assert p.returncode == 0, stderr[-4000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]) | {"stderr": stderr})
    return out


@pytest.mark.gpu
def test_build_cold_then_warm(tmp_path):
    (cold,) = _build_in(tmp_path)
    assert cold["cached"] is False and not cold["registration_errors"]
    assert "building Level 5 CUDA kernels for sm_" in cold["stderr"]
    (warm,) = _build_in(tmp_path)
    assert warm["cached"] is True and warm["seconds"] < 1.0, warm
    assert warm["stderr"].strip() == "", warm["stderr"]  # warm: nothing printed
    print(f"cold build {cold['seconds']:.1f} s, warm load {warm['seconds']:.3f} s")


@pytest.mark.gpu
def test_two_processes_building_cold_at_once_both_succeed(tmp_path):
    results = _build_in(tmp_path, n=2)
    assert sorted(r["cached"] for r in results) == [False, True]


def _some_level5_component() -> str:
    for c in ("layer_norm", "mlp", "conv_bn"):
        if c in COMPONENTS_WITH_KERNELS:
            return c
    pytest.skip("no Level 5 component yet")


class _Level5Block(torch.nn.Module):
    """A module whose forward calls a Level 5 op (the level module is looked up outside
    forward: Dynamo cannot trace importlib)."""

    def __init__(self, component: str):
        super().__init__()
        self.component, self.fn = component, getattr(levels.get("cuda"), component)
        g = torch.Generator().manual_seed(0)
        if component == "layer_norm":
            self.w = torch.nn.Parameter(torch.randn(96, generator=g) * 0.5 + 1)
            self.b = torch.nn.Parameter(torch.randn(96, generator=g) * 0.5)
        elif component == "mlp":
            self.w1 = torch.nn.Parameter(torch.randn(80, 48, generator=g) / 7)
            self.b1 = torch.nn.Parameter(torch.randn(80, generator=g) / 7)
            self.w2 = torch.nn.Parameter(torch.randn(40, 80, generator=g) / 9)
            self.b2 = torch.nn.Parameter(torch.randn(40, generator=g) / 9)
        else:
            self.cw = torch.nn.Parameter(torch.randn(10, 6, 3, 3, generator=g) / 7)
            self.bw = torch.nn.Parameter(torch.rand(10, generator=g) + 0.5)
            self.bb = torch.nn.Parameter(torch.randn(10, generator=g))
            self.register_buffer("rm", torch.randn(10, generator=g))
            self.register_buffer("rv", torch.rand(10, generator=g) + 0.5)

    def example(self):
        shape = {"layer_norm": (5, 7, 96), "mlp": (33, 48), "conv_bn": (2, 6, 9, 11)}[self.component]
        return torch.randn(shape, generator=torch.Generator().manual_seed(1)).cuda()

    def forward(self, x):
        if self.component == "layer_norm":
            return torch.relu(self.fn(x * 2, self.w, self.b))
        if self.component == "mlp":
            return torch.relu(self.fn(x * 2, self.w1, self.b1, self.w2, self.b2))
        return torch.relu(self.fn(x * 2, self.cw, None, self.bw, self.bb, self.rm, self.rv, padding=1))


@pytest.mark.gpu
def test_torch_compile_fullgraph_through_a_level5_op():
    block = _Level5Block(_some_level5_component()).cuda()
    x = block.example()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = block(x1)
    eager.sum().backward()
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x2)
    got.sum().backward()
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_levels_nn_layer_at_level5_matches_native():
    from levels import nn as lnn

    torch.manual_seed(0)
    _some_level5_component()
    if "layer_norm" in COMPONENTS_WITH_KERNELS:
        layer = lnn.LayerNorm(257, device="cuda")
        x = torch.randn(3, 257, device="cuda", requires_grad=True)
    else:
        layer = lnn.MLP(48, 80, 40, device="cuda")
        x = torch.randn(33, 48, device="cuda", requires_grad=True)
    ref = layer(x)
    ref_grad, = torch.autograd.grad(ref.sum(), x)
    layer.level = "cuda"
    out = layer(x)
    grad, = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
def test_level5_refuses_cpu_and_float64_tensors_naming_the_argument():
    cuda = levels.get("cuda")
    c = _some_level5_component()
    if c != "layer_norm":
        pytest.skip("checked through layer_norm")
    with pytest.raises(ValueError, match="argument 'x' must be a CUDA tensor"):
        cuda.layer_norm(torch.randn(2, 8), torch.ones(8), torch.zeros(8))
    d = dict(device="cuda", dtype=torch.float64)
    with pytest.raises(TypeError, match="argument 'x' must be float32, float16 or bfloat16"):
        cuda.layer_norm(torch.randn(2, 8, **d), torch.ones(8, **d), torch.zeros(8, **d))
