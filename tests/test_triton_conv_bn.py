"""Level 4 (Triton): conv2d + batchnorm, forward and backward.

Without a GPU these run in Triton's CPU interpreter (slow: sizes stay tiny). Every case is
compared with the float64 reference of equivalence/cards at the fixed tolerance of its
dtype (the running statistics it updates too), with uninitialized memory poisoned by NaN. @pytest.mark.gpu tests repeat
this on CUDA at fp16/bf16/fp32 with odd sizes.
"""

from __future__ import annotations

import pytest
import torch

# First: without a GPU this sets TRITON_INTERPRET=1, which must happen before anything
# imports triton (triton.language's own @jit helpers, e.g. tl.max's combine function, are
# built at import time and only work in the interpreter if it is on by then).
import levels.triton as L4  # isort: skip
import triton  # isort: skip
import triton.language as tl  # isort: skip
from triton_kernels.conv_bn import _divisor_args, _fast_div  # isort: skip
from equivalence import cards
from equivalence.check import check, check_args

pytest.importorskip("triton")

COMPONENT = "conv_bn"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _args(component, shape, dtype, seed=0, **variant):
    g = torch.Generator().manual_seed(seed)
    args = cards.get(component).module.make_args(shape, dtype, torch.device(DEVICE), g)
    args.update(variant)
    return args


def _passes(component, args):
    """The harness's own check (equivalence.check.check_args) on these exact arguments:
    outputs, updated buffers and every gradient against the float64 reference, poisoned."""
    r = check_args(component, "triton", args)
    assert r.passed, r.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_harness_tiny(dtype):
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert len(results) == len(cards.get(COMPONENT).variants) * len(cards.LAYOUTS)
    for r in results:
        assert r.status == "pass", f"{r.variant}: {r.status} {r.reason} {r.worst}"


def test_float64_is_refused_by_name():
    args = _args(COMPONENT, cards.get(COMPONENT).sizes["tiny"], torch.float64)
    with pytest.raises(TypeError, match=rf"{COMPONENT}: argument 'x'.*float64"):
        getattr(L4, COMPONENT)(**args)


@pytest.mark.parametrize("training", [False, True])
def test_conv_bn_channels_last_rect_kernel_no_bias(training):
    shape = dict(N=2, C_in=5, H=7, W=6, C_out=6, k=3, stride=(1, 2), padding=(0, 1),
                 channels_last=True)
    args = _args("conv_bn", shape, torch.float32, seed=4, training=training)
    w = args["conv_weight"][:, :, :2, :]  # a 2x3 kernel, as a strided view
    args["conv_weight"] = w
    args["conv_bias"] = None
    _passes("conv_bn", args)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("weight_layout", ["1x1", "channels_last 3x3", "strided 1x1"])
def test_conv_bn_eval_inference_applies_batchnorm_in_the_epilogue(bias, weight_layout):
    # Eval under no_grad with a weight whose channels are contiguous takes the fused path
    # (BatchNorm in the conv's epilogue, no fold kernel); the harness checks that forward
    # again with gradients off. A 1x1 strided view (channels 2 apart) takes the fold.
    k = 3 if "3x3" in weight_layout else 1
    shape = dict(N=2, C_in=6, H=5, W=7, C_out=10, k=k, stride=(2, 1), padding=(k // 2, 0),
                 channels_last=True)
    args = _args("conv_bn", shape, torch.float32, seed=5, training=False)
    if weight_layout == "channels_last 3x3":
        args["conv_weight"] = args["conv_weight"].contiguous(memory_format=torch.channels_last)
        assert args["conv_weight"].stride(1) == 1
    if weight_layout == "strided 1x1":
        w = args["conv_weight"]
        args["conv_weight"] = torch.cat([w, w], 1)[:, ::2]
        assert args["conv_weight"].stride(1) == 2
    if not bias:
        args["conv_bias"] = None
    _passes("conv_bn", args)


def test_conv_bn_train_statistics_merged_from_conv_tiles():
    # The batch statistics come from the conv's tiles (conv_fwd_kernel's TILE_STATS) merged
    # per chunk (stats_merge_kernel). In the interpreter a tile is 32 rows and a chunk a
    # third of the rows, whole tiles: here 312 rows are 10 tiles (the last of 24 rows) in
    # chunks of 4, 4 and 2 tiles, each merged 2 tiles a step (the last step half masked).
    shape = dict(N=2, C_in=3, H=12, W=13, C_out=5, k=3, stride=1, padding=1,
                 channels_last=True)
    _passes("conv_bn", _args("conv_bn", shape, torch.float32, seed=6, training=True))


def test_conv_bn_train_updates_running_stats_once():
    # The running statistics move in forward only (not again in backward), like BatchNorm2d.
    args = _args("conv_bn", cards.get("conv_bn").sizes["tiny"], torch.float32, training=True)
    rm, rv = args["running_mean"].clone(), args["running_var"].clone()
    x = args["x"].clone().requires_grad_(True)
    out = L4.conv_bn(x, args["conv_weight"], args["conv_bias"], args["bn_weight"], args["bn_bias"],
                     rm, rv, args["stride"], args["padding"], training=True)
    after_fwd = rm.clone(), rv.clone()
    out.sum().backward()
    assert not torch.equal(after_fwd[0], args["running_mean"])
    assert torch.equal(after_fwd[0], rm) and torch.equal(after_fwd[1], rv)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("shape", [
    dict(N=4, C_in=64, H=30, W=31, C_out=96, k=3, stride=1, padding=1, channels_last=True),
    dict(N=3, C_in=19, H=17, W=20, C_out=33, k=3, stride=2, padding=1),
])
def test_conv_bn_gpu(dtype, training, shape):
    _passes("conv_bn", _args("conv_bn", shape, dtype, seed=shape["C_in"], training=training))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("shape", [
    # ResNet-50's stem: K_total 147 in 64-wide tiles, 112-wide rows in two chunks of 64
    dict(N=2, C_in=3, H=224, W=224, C_out=64, k=7, stride=2, padding=3, channels_last=True),
    # 48-wide rows in steps 64 wide: a quarter of each step masked
    dict(N=3, C_in=32, H=48, W=48, C_out=40, k=3, stride=1, padding=1, channels_last=True),
])
def test_conv_bn_gpu_wgrad_row_steps(shape):
    # The GPU's row rule (64-pixel steps, its own tiles) at shapes the CPU's 16-pixel steps
    # never reach, forward and backward against float64.
    from triton_kernels import conv_bn as K
    k, s, pad = shape["k"], shape["stride"], shape["padding"]
    H_out = (shape["H"] + 2 * pad - k) // s + 1
    W_out = (shape["W"] + 2 * pad - k) // s + 1
    plan, _ = K._wgrad_plan(shape["N"] * H_out * W_out, shape["C_in"], shape["C_out"],
                            k * k * shape["C_in"], torch.bfloat16, torch.device("cuda"),
                            H_out, W_out)
    assert plan["ROW_W"] == 64, plan
    assert plan["BLOCK_N"] == K.wgrad_row_columns(k * k * shape["C_in"])
    _passes("conv_bn", _args("conv_bn", shape, torch.bfloat16, seed=19, training=True))


def _misaligned_channels_last(t):
    """t's values in channels_last, starting one element past a 16-byte boundary (a view cut
    out of a bigger buffer): the kernels may assume neither alignment nor NCHW strides."""
    N, C, H, W = t.shape
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    view = flat.view(N, H, W, C).permute(0, 3, 1, 2)
    view.copy_(t)
    assert view.stride(1) == 1 and view.data_ptr() % 16 != 0
    return view


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("shape", [
    # stride 2 down, 3 across, odd sizes: six phases, one tap across in each
    dict(N=2, C_in=5, H=9, W=11, C_out=6, k=3, stride=(2, 3), padding=(1, 0)),
    # 1x1 stride 2: the odd rows and columns belong to no output; their phases have no tap
    # and must write zeros to dx
    dict(N=2, C_in=4, H=7, W=6, C_out=5, k=1, stride=2, padding=0),
    # 2x2 stride 3, padding 1: one phase of three per axis has no tap, the others one each
    dict(N=1, C_in=3, H=8, W=10, C_out=4, k=2, stride=3, padding=1),
])
def test_conv_bn_dgrad_stride_phases(shape, training):
    # dx is one implicit GEMM per stride phase (conv_dgrad_kernel); the harness checks it,
    # with x misaligned and channels_last, against the float64 reference.
    args = _args("conv_bn", shape, torch.float32, seed=7, training=training)
    args["x"] = _misaligned_channels_last(args["x"])
    _passes("conv_bn", args)


@pytest.mark.parametrize("weight_layout", ["contiguous", "channels_last"])
def test_conv_bn_train_wgrad_single_split_writes_dw_directly(weight_layout):
    # At most one BLOCK_K of pixels (here 1 x 3 x 4 = 12 outputs) gives one split: the wgrad
    # kernel stores dW itself, through dW's own strides (DIRECT), with no finish kernel.
    shape = dict(N=1, C_in=6, H=6, W=8, C_out=7, k=3, stride=2, padding=0,
                 channels_last=weight_layout == "channels_last")
    args = _args("conv_bn", shape, torch.float32, seed=8, training=True)
    from triton_kernels import conv_bn as K
    P = 1 * 2 * 3
    plan, splits = K._wgrad_plan(P, 6, 7, 3 * 3 * 6, torch.float32, torch.device(DEVICE))
    assert splits == 1
    _passes("conv_bn", args)


@pytest.mark.parametrize("steps", ["rows", "flat"])
@pytest.mark.parametrize("shape", [
    # 8 columns: two output rows a step (in the interpreter's 16-pixel steps)
    dict(N=2, C_in=5, H=8, W=8, C_out=6, k=3, stride=1, padding=1, channels_last=True),
    # stride 2, 4x4 outputs: four rows a step; x in torch's default layout
    dict(N=2, C_in=3, H=8, W=7, C_out=4, k=3, stride=2, padding=1),
    # 30 columns: each row in two 16-wide chunks, the second two pixels short
    dict(N=1, C_in=4, H=3, W=30, C_out=5, k=3, stride=1, padding=1, channels_last=True),
    # 1x1, 6 columns in steps 8 wide: a quarter of each step masked
    dict(N=3, C_in=6, H=4, W=6, C_out=3, k=1, stride=1, padding=0),
])
def test_conv_bn_train_wgrad_row_steps(shape, steps, monkeypatch):
    # The weight gradient steps over whole output rows (ROW_W: the step's image and first
    # row are its scalars, no division per pixel) where a step's rows stay in one image;
    # flat steps otherwise, and always with ROW_STEPS off. Both against float64.
    from triton_kernels import conv_bn as K
    monkeypatch.setattr(K, "ROW_STEPS", steps == "rows")
    k, s, pad = shape["k"], shape["stride"], shape["padding"]
    H_out = (shape["H"] + 2 * pad - k) // s + 1
    W_out = (shape["W"] + 2 * pad - k) // s + 1
    P = shape["N"] * H_out * W_out
    plan, splits = K._wgrad_plan(P, shape["C_in"], shape["C_out"], k * k * shape["C_in"],
                                 torch.float32, torch.device(DEVICE), H_out, W_out)
    # (the interpreter's 16-pixel steps take rows at every shape here; a GPU's wider
    # steps may not, e.g. four 4-row images in 32 pixels)
    can = K.wgrad_row_width(H_out, W_out, plan["BLOCK_K"]) > 0
    assert can or not K.INTERPRETED, (H_out, W_out, plan)
    assert (plan["ROW_W"] > 0) == (steps == "rows" and can), plan
    if plan["ROW_W"]:
        steps_total, row_steps, w_chunks = plan["rows"]
        assert steps_total == shape["N"] * row_steps and splits * plan["per_split"] >= steps_total
    _passes("conv_bn", _args("conv_bn", shape, torch.float32, seed=13, training=True))


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_bn_train_steps_through_taps_and_channel_blocks(stride):
    # The forward's and the input gradient's loops carry their tap and channel block from
    # step to step (counters, not divisions of the step index): here several blocks of
    # input channels (the forward's reduction) and of output channels (the input
    # gradient's) at every tap of a 3x3, in the interpreter's 16-channel blocks.
    shape = dict(N=2, C_in=37, H=7, W=6, C_out=40, k=3, stride=stride, padding=1,
                 channels_last=stride == 1)
    _passes("conv_bn", _args("conv_bn", shape, torch.float32, seed=17, training=True))


def test_wgrad_row_width_keeps_a_step_in_one_image():
    from triton_kernels.conv_bn import wgrad_row_width
    assert wgrad_row_width(64, 64, 64) == 64   # one row a step
    assert wgrad_row_width(32, 32, 64) == 32   # two rows
    assert wgrad_row_width(16, 16, 64) == 16   # four
    assert wgrad_row_width(112, 112, 64) == 64  # a row in two chunks, 112 of 128 used
    assert wgrad_row_width(28, 28, 64) == 32   # 28 of 32 columns used
    assert wgrad_row_width(14, 14, 64) == 0    # four 16-wide rows would cross images
    assert wgrad_row_width(7, 7, 64) == 0      # so would eight of 8
    assert wgrad_row_width(10, 5, 16) == 0     # 5 of 8 columns: flat


def test_wgrad_row_columns_are_128_wide_only_where_mostly_real():
    from triton_kernels.conv_bn import wgrad_row_columns
    # K_total = kH*kW*C_in: the CNN's 3x3 convolutions and 1x1s at 128 and more channels
    assert [wgrad_row_columns(k) for k in (576, 1152, 2304, 128, 256, 1024)] == [128] * 6
    # the stems (3x3x3, ResNet-50's 7x7x3) and a 1x1 of 64 channels
    assert [wgrad_row_columns(k) for k in (27, 147, 64)] == [64] * 3


@pytest.mark.parametrize("weight_layout", ["contiguous", "channels_last", "1x1 contiguous"])
def test_conv_bn_train_reads_the_weight_with_adjacent_input_channels(weight_layout, monkeypatch):
    # torch's default (O, I, kH, kW) weight puts a tap's input channels kH*kW elements apart:
    # the training forward and the input gradient get a (O, kH, kW, I) copy instead
    # (_k_major), channels_last and 1x1 weights are read as they are, and dW keeps w's own
    # layout (a parameter's .grad like the parameter: autograd copies nothing).
    from triton_kernels import conv_bn as K

    k = 1 if weight_layout.startswith("1x1") else 3
    shape = dict(N=2, C_in=5, H=6, W=5, C_out=4, k=k, stride=1, padding=k // 2,
                 channels_last=weight_layout == "channels_last")
    args = _args("conv_bn", shape, torch.float32, seed=11, training=True)
    w = args["conv_weight"]
    seen = []
    for name in ("_conv_fwd", "_conv_dgrad"):
        real = getattr(K, name)

        def spy(*a, _real=real, _name=name, **kw):
            seen.append((_name, a[1].stride(), a[2]))
            return _real(*a, **kw)
        monkeypatch.setattr(K, name, spy)
    x = args["x"].detach().requires_grad_(True)
    w_leaf = w.detach().clone(memory_format=torch.preserve_format).requires_grad_(True)
    call = dict(args, x=x, conv_weight=w_leaf)
    out = L4.conv_bn(**call)
    out.backward(torch.randn_like(out))
    # (on a GPU the replay's dry pass runs these launchers too: each is seen at least once)
    assert {n for n, _, _ in seen} == {"_conv_fwd", "_conv_dgrad"}
    for name, strides, passed in seen:
        assert strides[1] == 1, f"{name} read a weight whose input channels are {strides[1]} apart"
        assert tuple(passed) == (strides[0], strides[1], strides[2], strides[3])
    assert w_leaf.grad.stride() == w_leaf.stride()
    _passes("conv_bn", args)  # and the values, against the float64 reference


def test_divisor_magic_divides_every_pixel_index_exactly():
    # The weight gradient splits pixel indices with a multiply-high and a shift instead of a
    # division (_fast_div): exact for every divisor and every index below 2**31, checked
    # here in Python integers at the edges and at random (the kernel's uint32 arithmetic
    # runs the same in the interpreter's tests above and below).
    import random

    from triton_kernels.conv_bn import _divisor_magic
    rng = random.Random(0)
    for d in [*range(1, 3000), *(rng.randrange(1, 2 ** 31) for _ in range(3000))]:
        m, s = _divisor_magic(d)
        assert 0 <= m < 2 ** 32 and s >= 0
        for x in (0, 1, d - 1, d, d + 1, 2 ** 31 - 1, *(rng.randrange(2 ** 31) for _ in range(20))):
            q = x if d == 1 else (x * m >> 32) >> s
            assert q == x // d, (d, x)
    with pytest.raises(ValueError, match="divisor"):
        _divisor_magic(0)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("shape", [
    # output 4 wide (a ResNet's last stage at 128x128 input): W_out's shift is 1
    dict(N=2, C_in=8, H=4, W=4, C_out=16, k=3, stride=1, padding=1, channels_last=True),
    # 3 pixels in all: both divisors' shifts are 1
    dict(N=3, C_in=8, H=1, W=3, C_out=16, k=1, stride=1, padding=0),
    # one column: W_out = 1, the divisor _fast_div answers without its multiplier
    dict(N=2, C_in=8, H=5, W=1, C_out=16, k=1, stride=1, padding=0),
])
def test_conv_bn_gpu_wgrad_divisors_that_triton_would_specialize(shape):
    # Triton compiles an integer argument equal to 1 as a constant; the wgrad kernel's
    # shifts are data (do_not_specialize). Found in the CNN's training test on the H200:
    # a 4-wide output failed to compile ("'int' object has no attribute 'to'").
    _passes("conv_bn", _args("conv_bn", shape, torch.bfloat16, seed=11, training=True))


@triton.jit
def _div_compiled_in(x_ptr, out_ptr, n, d, MAGIC: tl.constexpr, SHIFT: tl.constexpr,
                     B: tl.constexpr):
    o = tl.arange(0, B)
    x = tl.load(x_ptr + o, mask=o < n, other=0)
    tl.store(out_ptr + o, _fast_div(x, d, MAGIC, SHIFT), mask=o < n)


@triton.jit
def _div_passed(x_ptr, out_ptr, n, d, magic, shift, B: tl.constexpr):
    o = tl.arange(0, B)
    x = tl.load(x_ptr + o, mask=o < n, other=0)
    tl.store(out_ptr + o, _fast_div(x, d, magic, shift), mask=o < n)


def test_fast_div_takes_its_divisor_constants_as_arguments_or_compiled_in():
    # Inductor (a model compiled whole) compiles an argument equal to 1 into the kernel as a
    # constant, do_not_specialize or not: _fast_div must divide exactly either way. Here
    # both ways, the multiplier and shift as constexpr and as arguments, against x // d (on
    # the GPU, or in the interpreter, which hands constexpr over as Python ints: the
    # failure found on the H200, "'int' object has no attribute 'to'", shows here too).
    # The arguments are int32 (Inductor fails on a Python int >= 2**31 as an argument).
    gen = torch.Generator().manual_seed(12)
    for d in (1, 3, 4, 7, 12, 1000, 2 ** 31 - 1):
        x = torch.randint(0, 2 ** 31 - 1, (64,), dtype=torch.int32, generator=gen)
        x[:4] = torch.tensor([0, 1, d, 2 ** 31 - 1])
        x = x.to(DEVICE)
        m, s = _divisor_args(d)
        assert -2 ** 31 <= m < 2 ** 31 and 0 <= s < 32
        a, b = torch.full_like(x, -1), torch.full_like(x, -1)
        _div_compiled_in[(1,)](x, a, 64, d, MAGIC=m, SHIFT=s, B=64)
        _div_passed[(1,)](x, b, 64, d, m, s, B=64)
        assert torch.equal(a, x // d) and torch.equal(b, x // d), d


@pytest.mark.parametrize("training", [False, True])
def test_conv_bn_channel_blocks_past_eight_input_channels(training):
    # Up to 8 input channels the forward walks k = (i, j, c) flat (FLAT_K: the stem's 3);
    # from 9 on, one channel block per tap: 20 channels are two blocks, the second masked.
    shape = dict(N=1, C_in=20, H=5, W=6, C_out=5, k=3, stride=1, padding=1, channels_last=True)
    _passes("conv_bn", _args("conv_bn", shape, torch.float32, seed=9, training=training))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("training", [False, True])
def test_conv_bn_gpu_resnet_stem_full_size(training):
    # The stem at full size, bf16 channels_last: the forward's flat k (3 channels), the dgrad's
    # four stride phases on 16-wide tiles, and in training the conv bias's gradient (exactly 0)
    # summed from the fp32 dyc over P = 401408 pixels (the bf16-rounded sum failed here).
    stem = next(s for s in cards.get("conv_bn").model_shapes if s.name == "resnet50-stem")
    _passes("conv_bn", _args("conv_bn", stem.sizes, torch.bfloat16, seed=3, training=training))


@pytest.mark.parametrize("training", [True, False])
def test_batchnorms_gradients_are_made_in_batchnorms_dtype(training):
    # Under torch.autocast conv_bn takes float32 BatchNorm tensors beside a 16-bit x. Its
    # dgamma and dbeta are made in float32 by the kernels themselves: a 16-bit gradient would
    # make autograd cast it back (two casts a call, each a launch and an allocation: 18 a
    # CNN step), and would round it to 16 bits on the way.
    from torch.utils._python_dispatch import TorchDispatchMode

    import levels
    from equivalence.check import compare
    from equivalence.tolerances import tolerance

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen += func is torch.ops.aten._to_copy.default
            return func(*args, **(kwargs or {}))

    args = _args("conv_bn", cards.get("conv_bn").sizes["tiny"], torch.float32, seed=8,
                 training=training)
    bn = {k: args[k].detach().clone().requires_grad_() for k in ("bn_weight", "bn_bias")}
    half = {k: args[k].detach().half().requires_grad_() for k in ("x", "conv_weight", "conv_bias")}
    stats = {k: args[k].clone() for k in ("running_mean", "running_var")}
    out = L4.conv_bn(**half, **bn, **stats, stride=args["stride"], padding=args["padding"],
                     training=training)
    loss = out.float().square().sum()
    with Casts() as casts:
        loss.backward()
    assert casts.seen == 1  # the backward of the loss's own .float(), none of conv_bn's
    wide = {k: v.detach().double().requires_grad_() for k, v in {**half, **bn}.items()}
    ref = levels.get("native").conv_bn(**wide, **{k: args[k].double() for k in stats},
                                       stride=args["stride"], padding=args["padding"],
                                       training=training)
    ref.square().sum().backward()
    for k in bn:
        assert bn[k].grad.dtype == torch.float32
        # float32 gradients of a computation in float16: float16's bound
        c = compare(k, bn[k].grad, wide[k].grad, tolerance(torch.float16), torch.float32)
        assert c.ok, c
