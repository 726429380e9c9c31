"""Where Level 4's host microseconds go, piece by piece (GPU only).

    PYTHONPATH=. python3 scripts/probe_host.py                # JSON to $OUT/probe_host.json
    PYTHONPATH=. python3 scripts/probe_host.py reports/h100-host-probe.json   # the record

Times, calls back to back at a tiny shape, each piece of a Level 4 layer_norm and MLP call
against eager PyTorch: the contract's validation, allocations, the JIT launch
(`kernel[grid]`), the direct launch (triton_kernels/launch.py), the compiled kernel's
launcher alone, autograd.Function.apply. The measurements are the cards' (HOST_PROBE in
equivalence/cards/<component>.py), run by equivalence/commands/host_probe.py (`levels explain
--level triton` shows them as a table; the "fast launch OFF" rows in a child process started
with LEVELS_TRITON_FAST_LAUNCH=0); this writes all of them, in the shape of the recorded
reports/h100-host-probe.json. Without a CUDA GPU it says why and exits 3."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from equivalence.commands import host_probe  # imports levels before triton

if __name__ == "__main__":
    try:
        res = host_probe.probe("cuda")
    except host_probe.HostProbeUnavailable as exc:
        print(exc, file=sys.stderr)
        sys.exit(3)
    print(json.dumps(res, indent=1))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "/tmp"),
                                                              "probe_host.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"written: {path}", file=sys.stderr)
