"""torch.autocast at every level: fp32 parameters, bf16 (fp16) computation, as torch's own
operators get it (levels.contract.autocasts).

Per component and level that runs here: under autocast the call gives what the level gives
on the arguments cast as torch casts those of the operator it replaces (AUTOCAST), the
result has the dtype torch's operator returns there (F.layer_norm: float32; the others: the
autocast dtype), the gradients reach the float32 parameters in float32, and the result is
the float64 reference of the cast arguments within the computing dtype's bound. Without
autocast nothing changes. On a GPU the same runs at Levels 4 and 5 with bf16 and fp16."""

from __future__ import annotations

import levels  # noqa: F401 - first: it switches Triton's interpreter on where there is no GPU

import pytest
import torch
import torch.nn.functional as F

from equivalence import cards as specs
from equivalence.check import compare, flatten
from equivalence.tolerances import tolerance
from levels.contract import AUTOCAST, COMPONENTS, FLOAT32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_LEVELS = ("native", "torchscript", "compile", "triton")


def _args(component: str) -> dict:
    spec = specs.get(component)
    variant = "train" if component == "conv_bn" else next(iter(spec.variants))
    return dict(spec.case("tiny", variant, torch.float32, DEVICE, seed=5).args)


def _leaves(args: dict, component: str) -> dict:
    wants = set(specs.get(component).differentiable)
    return {k: v.detach().clone().requires_grad_(k in wants) if isinstance(v, torch.Tensor) else v
            for k, v in args.items()}


def _cast(args: dict, component: str, dtype: torch.dtype) -> dict:
    target, names = AUTOCAST[component]
    to = torch.float32 if target == FLOAT32 else dtype
    return {k: v.to(to) if k in names else v for k, v in args.items()}


def _level(name):
    reason = levels.status(name, DEVICE)
    if reason:
        pytest.skip(reason)
    return levels.get(name)


@pytest.mark.parametrize("level", CPU_LEVELS if DEVICE == "cpu" else levels.LEVEL_NAMES)
@pytest.mark.parametrize("component", COMPONENTS)
def test_under_autocast_a_level_computes_its_function_of_the_cast_arguments(component, level):
    module = _level(level)
    fn = getattr(module, component)
    dtype = torch.bfloat16
    leaves = _leaves(_args(component), component)
    by_hand = _cast(_leaves(_args(component), component), component, dtype)
    for _ in range(3):
        # TorchScript's profiling executor runs a function's first calls unfused and later
        # ones through the fused graph it built from them (on a GPU: other roundings in
        # bfloat16), so both calls below must come after those first ones
        fn(**by_hand)
    with torch.autocast(DEVICE, dtype=dtype):
        got = flatten(fn(**leaves))
    # the same call on arguments cast by hand, outside autocast: bit for bit the same
    want = flatten(fn(**by_hand))
    compute = torch.float32 if AUTOCAST[component][0] == FLOAT32 else dtype
    for g, w in zip(got, want):
        assert g.dtype == compute, (component, level, g.dtype)
        assert torch.equal(g, w), (component, level)
    # the float64 reference of the cast arguments, within the computing dtype's bound
    spec = specs.get(component)
    ref_args = {k: v.detach().to(torch.float64) if isinstance(v, torch.Tensor) else v
                for k, v in _cast(_args(component), component, dtype).items()}
    ref = spec.reference(ref_args)
    bound = spec.tolerance(compute, tolerance(compute, tf32=bool(
        module.uses_tf32(component, torch.device(DEVICE), compute))))  # the card's, if its own
    for name, g, r in zip(spec.outputs, got, ref):
        c = compare(name, g, r, bound, compute)
        assert c.ok, (component, level, c)
    # gradients: float32, to the float32 parameters (none for a forward-only component)
    outs = [o for o in got[:len(got)] if o.requires_grad]
    if not spec.differentiable:
        assert not outs, (component, level)
        return
    grads = torch.autograd.grad(outs, [v for v in leaves.values()
                                       if isinstance(v, torch.Tensor) and v.requires_grad],
                                [torch.ones_like(o) for o in outs])
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("component", COMPONENTS)
def test_the_output_dtype_is_torchs_own_operators(component):
    # the rule of each component is the rule torch applies to the operator it replaces
    x = torch.randn(4, 8, device=DEVICE)
    w = torch.randn(8, 8, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        torch_out = {"layer_norm": F.layer_norm(x, (8,), torch.ones(8, device=DEVICE)),
                     "mlp": F.linear(x, w),
                     "swiglu_mlp": F.linear(x, w),
                     "attention": F.scaled_dot_product_attention(x[None, None], x[None, None],
                                                                 x[None, None]),
                     "conv_bn": F.conv2d(x[None, None], w[None, None, :3, :3]),
                     "lstm": torch.nn.LSTM(8, 8, batch_first=True, device=DEVICE)(x[None])[0],
                     "rms_norm": F.rms_norm(x, (8,), torch.ones(8, device=DEVICE)),
                     # no torch operator: the dtype of the q and k it rotates, F.linear's
                     "rope": F.linear(x, w),
                     # no torch operator: its iterations are torch.matmul's
                     "newton_schulz": torch.matmul(x, x.t()),
                     }[component]
    target = AUTOCAST[component][0]
    assert torch_out.dtype == (torch.float32 if target == FLOAT32 else torch.bfloat16)


def test_outside_autocast_nothing_is_cast():
    args = _args("mlp")
    out = levels.get("native").mlp(**args)
    assert out.dtype == torch.float32
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=False):
        assert levels.get("native").mlp(**args).dtype == torch.float32


def test_the_casts_are_the_same_by_position_and_by_keyword():
    # autocast_args looks only at the arguments AUTOCAST names, found by their position in
    # the contract or by keyword: conv_bn casts x, conv_weight and conv_bias and leaves
    # BatchNorm's float32 parameters, the running statistics and the scalars as they are;
    # attention's rope tuple is cast element by element.
    from levels.contract import autocast_args
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 3, 5, 5, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    bn = [torch.randn(4, generator=g) for _ in range(4)]
    positional = (x, w, None, *bn, (1, 1), (1, 1), 1e-5, 0.1, True)
    names = ("x", "conv_weight", "conv_bias", "bn_weight", "bn_bias", "running_mean",
             "running_var", "stride", "padding", "eps", "momentum", "training")
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        by_position, _, device_type = autocast_args("conv_bn", positional, {})
        head, k, _ = autocast_args("conv_bn", positional[:1], dict(zip(names[1:], positional[1:])))
    assert device_type == DEVICE
    for got in (by_position, head + tuple(k[n] for n in names[1:])):
        assert got[0].dtype == got[1].dtype == torch.bfloat16
        assert got[2] is None and all(t is u for t, u in zip(got[3:7], bn))
        assert got[7:] == positional[7:]
    q = torch.randn(1, 2, 4, 8, generator=g)
    cos, sin = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        _, k, _ = autocast_args("attention", (q, q, q), dict(causal=True, rope=(cos, sin, True)))
    assert [t.dtype for t in k["rope"][:2]] == [torch.bfloat16] * 2 and k["rope"][2] is True
    assert k["causal"] is True


def test_a_bad_argument_is_refused_by_name_under_autocast_too():
    args = _args("layer_norm")
    args["weight"] = args["weight"][:-1]
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        with pytest.raises(ValueError, match="layer_norm: argument 'weight' must be of shape"):
            levels.get("native").layer_norm(**args)


def test_a_call_runs_with_autocast_off_and_switches_it_back_on_even_when_it_raises():
    # the decorator flips autocast's flag around the call (not a torch.autocast block): the
    # level sees it off, and the caller's region has it on again afterwards, raise or not
    from levels.contract import autocasts

    seen = []

    @autocasts("layer_norm")
    def probe(x, weight, bias, eps=1e-5):
        seen.append(torch.is_autocast_enabled(DEVICE))
        if eps < 0:
            raise ValueError("layer_norm: argument 'eps' must be >= 0")
        return x

    args = _args("layer_norm")
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert probe(**args).dtype == torch.float32  # layer_norm's rule: cast to float32
        with pytest.raises(ValueError, match="argument 'eps'"):
            probe(**{**args, "eps": -1.0})
        assert torch.is_autocast_enabled(DEVICE)
        assert torch.get_autocast_dtype(DEVICE) == torch.bfloat16
    assert seen == [False, False]
    assert not torch.is_autocast_enabled(DEVICE)


def test_models_of_levels_nn_train_under_autocast():
    # a GPT-style block from levels.nn layers: fp32 parameters, bf16 compute, fp32 gradients
    from levels.models import gpt
    model = gpt.GPT(gpt.GPTConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=1)).to(DEVICE)
    tokens = torch.randint(0, 32, (2, 8), device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        logits = model(tokens)
    assert logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
