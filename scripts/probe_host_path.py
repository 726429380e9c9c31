"""Where a Level 4 / Level 5 call's host time goes on a GPU machine (diagnostic for the
host-path work): micro-probes of the pieces every call pays (autograd.Function with empty
bodies on CUDA vs CPU tensors: the autograd engine's hand-off to its device thread; a C++
op through torch.ops; allocations; Triton's launcher), the components' calls end to end,
a cProfile of the slowest, and Dynamo's graph breaks of a small GPT at each level.

    PYTHONPATH=. python3 scripts/probe_host_path.py            # JSON to $OUT/probe_host_path.json
"""
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import levels  # noqa: E402  first: Triton's interpreter switch
import torch  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
LEVELS = ("triton", "cuda") if DEV == "cuda" else ("native",)
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
RESULT: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__}


def us(fn, n=None, sync=True, min_s=0.25):
    """Median over batches: microseconds per call, calls back to back, one sync per batch."""
    dev = torch.cuda.is_available() and sync
    fn(); fn()
    if dev:
        torch.cuda.synchronize()
    batch = 50
    per = []
    t_end = time.perf_counter() + min_s
    while time.perf_counter() < t_end or len(per) < 5:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        if dev:
            torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / batch * 1e6)
    per.sort()
    return round(per[len(per) // 2], 2)


def section(name, items):
    RESULT[name] = items
    print(f"== {name}")
    for k, v in items.items():
        print(f"   {v!s:>10}  {k}")


def micro():
    dev = DEV
    xs = {d: (torch.randn(64, device=d, requires_grad=True)) for d in dict.fromkeys(("cpu", dev))}

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.new_empty(x.shape)

        @staticmethod
        def backward(ctx, g):
            return g

    r = {}
    for d, x in xs.items():
        g = torch.ones_like(x)
        r[f"empty Function fwd+grad ({d})"] = us(lambda: torch.autograd.grad([Empty.apply(x)], [x], [g]))
        r[f"relu fwd+grad ({d})"] = us(lambda: torch.autograd.grad([torch.relu(x)], [x], [g]))
        r[f"Function.apply only ({d})"] = us(lambda: Empty.apply(x))
        r[f"torch.empty_like ({d})"] = us(lambda: torch.empty_like(x), sync=False)
    x = xs[dev]
    r["x.new_empty((2, 64), float32) cuda"] = us(lambda: x.new_empty((2, 64)), sync=False)
    ln = torch.ops.aten.layer_norm.default
    xl, wl, bl = torch.randn(148, 64, device=dev), torch.randn(64, device=dev), torch.randn(64, device=dev)
    r["F.layer_norm no_grad"] = us(lambda: torch.nn.functional.layer_norm(xl, (64,), wl, bl))
    r["torch.ops.aten.layer_norm.default"] = us(lambda: ln(xl, [64], wl, bl))
    r["torch.cuda.current_stream()"] = us(lambda: torch.cuda.current_stream(), sync=False)
    section("micro", r)


def components():
    from equivalence import cards as specs
    from equivalence.calls import own_args as _own_args, upstream as _upstream
    from equivalence.check import flatten

    r = {}
    profiles = {}
    for comp in ("layer_norm", "mlp", "attention", "conv_bn"):
        spec = specs.get(comp)
        variant = next(iter(spec.variants))
        case = spec.case("tiny", variant, DTYPE, DEV, 0)
        args = case.args
        for level in LEVELS:
            fn = getattr(levels.get(level), comp)
            plain = _own_args(args, comp, training=False)
            leaves = _own_args(args, comp, training=True)
            inputs = [leaves[n] for n in case.differentiable]

            def fwd():
                with torch.no_grad():
                    return fn(**plain)
            grads = []

            def fb():
                outs = flatten(fn(**leaves))
                if not grads:
                    grads.extend(_upstream(outs, 0))
                torch.autograd.grad(outs[:len(grads)], inputs, grads[:len(outs)], allow_unused=True)
            try:
                r[f"{comp} {level} fwd"] = us(fwd)
                r[f"{comp} {level} fwd+bwd"] = us(fb)
                if comp in ("layer_norm", "mlp"):
                    pr = cProfile.Profile()
                    pr.enable()
                    for _ in range(300):
                        fb()
                    if DEV == "cuda":
                        torch.cuda.synchronize()
                    pr.disable()
                    s = io.StringIO()
                    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
                    profiles[f"{comp} {level}"] = s.getvalue()
            except Exception as exc:  # noqa: BLE001
                r[f"{comp} {level}"] = f"error {type(exc).__name__}: {str(exc)[:200]}"
        r[f"{comp} variant"] = str(case.variant) if hasattr(case, "variant") else ""
    section("components", r)
    RESULT["profiles"] = profiles
    for k, v in profiles.items():
        print(f"---- cProfile {k} (300 fwd+bwd)\n{v[:3000]}")


def graph_breaks():
    import torch._dynamo
    from levels.models import gpt
    r = {}
    for level in LEVELS:
        torch._dynamo.reset()
        try:
            cfg = gpt.GPTConfig(vocab=128, seq_len=64, d_model=128, n_heads=2, n_layers=2)
            model = gpt.GPT(cfg, level=level).to(DEV, DTYPE)
            tokens = torch.randint(0, 128, (2, 64), device=DEV)
            t0 = time.perf_counter()
            ex = torch._dynamo.explain(model)(tokens)
            r[level] = {"graphs": ex.graph_count, "breaks": ex.graph_break_count,
                        "reasons": [str(b.reason)[:300] for b in ex.break_reasons][:8],
                        "s": round(time.perf_counter() - t0, 1)}
        except Exception as exc:  # noqa: BLE001
            r[level] = f"error {type(exc).__name__}: {str(exc)[:400]}"
    section("graph_breaks", r)


if __name__ == "__main__":
    for step in (micro, components, graph_breaks):
        try:
            step()
        except Exception as exc:  # noqa: BLE001
            import traceback
            RESULT[step.__name__ + "_error"] = traceback.format_exc()[-2000:]
            print(traceback.format_exc())
        with open(os.path.join(OUT, "probe_host_path.json"), "w") as f:
            json.dump(RESULT, f, indent=1)
