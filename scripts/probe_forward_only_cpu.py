"""Host time of a Level 5 forward-only call through autograd.cpp, on a CPU: the C++ glue
alone. autograd.cpp is built for the CPU (as tests/test_cuda_autograd_cpu.py builds it), its
kernel ops registered as torch twins that compute once and then return the same tensors at
once, so what is timed is the composite op: the dispatcher, the layout work, the autograd
Function (or its forward-only shortcut) and the kernel ops' dispatch.

    python scripts/probe_forward_only_cpu.py [--kernels-dir DIR] [--runs 7]

--kernels-dir: where autograd.cpp and its *_autograd.cpp fragments are read from (default
cuda_kernels/); to time an older version, write its files there first, e.g.
    mkdir /tmp/old && for f in autograd rms_norm_autograd rope_autograd swiglu_mlp_autograd;
      do git show REV:cuda_kernels/$f.cpp > /tmp/old/$f.cpp; done
One version per process (both would define the same ops). A 2-core CI machine drifts by 50%
from run to run: run each version several times, alternating, and compare the best.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import levels  # noqa: E402,F401 - first: switches Triton's interpreter on without a GPU
import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

from cuda_kernels import build  # noqa: E402
import tests.test_cuda_autograd_cpu as cpu_build  # noqa: E402


def _load(kernels_dir: Path):
    source = build.autograd_source(kernels_dir)
    key = hashlib.sha256(source.encode()).hexdigest()[:12]
    directory = Path("/tmp") / f"levels-forward-only-{key}"
    directory.mkdir(exist_ok=True)
    copy = directory / build.AUTOGRAD
    if not copy.exists():
        copy.write_text(source)
    lib = torch.library.Library(build.OP_NAMESPACE, "FRAGMENT")
    cached: dict = {}

    def instant(name):  # the twin's result once, then the same tensors at once
        twin = cpu_build.TWINS[name]

        def op(*args):
            if name not in cached:
                cached[name] = twin(*args)
            return cached[name]
        return op
    for name, schema in cpu_build.kernel_op_schemas().items():
        lib.define(schema)
        lib.impl(name, instant(name), "CPU")
    cpp_extension.load(name=f"levels_forward_only_{key}", sources=[str(copy)],
                       extra_cflags=["-O1"], build_directory=str(directory), with_cuda=False,
                       is_python_module=False)
    return lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels-dir", type=Path, default=build.KERNELS_DIR)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    lib = _load(a.kernels_dir)  # noqa: F841 - keeps the twins registered
    ops = torch.ops.levels_cuda
    x, w, b = torch.randn(2, 5, 129), torch.randn(129), torch.randn(129)
    xc, cw = torch.randn(2, 3, 9, 11), torch.randn(5, 3, 3, 3)
    c5 = [torch.randn(5), torch.rand(5) + 0.5, torch.randn(5), torch.randn(5), torch.rand(5) + 0.5]
    calls = {"layer_norm": lambda: ops.layer_norm(x, w, b, 1e-5, 3),
             "conv_bn (eval)": lambda: ops.conv_bn(xc, cw, *c5, [1, 1], [1, 1], 1e-5, 0.1, False, 6)}
    with torch.no_grad():
        for name, fn in calls.items():
            for _ in range(200):
                fn()
            per_run = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                for _ in range(2000):
                    fn()
                per_run.append((time.perf_counter() - t0) / 2000 * 1e6)
            print(f"{name:16s} under no_grad: median {statistics.median(per_run):6.2f} us a call, "
                  f"best {min(per_run):6.2f} ({a.kernels_dir})")


if __name__ == "__main__":
    main()
