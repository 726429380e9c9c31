#!/usr/bin/env bash
# Level 4's C++ host path (triton_kernels/replay.py) and the whole-model work after it, on the
# GPU, one device call per run: STEPS="tests overhead" (default), or any of the steps below
# (tests, overhead, tables, the probes, matrix1-<model>-<mode>[-amp] for one training table,
# compile-breaks, the Level 5 and Level 4 kernel checks of 2026-11-26: norms5 gemm-mn ...)
# Every output lands in $OUT (one tarball, replay.tar.gz, plus the JSON reports).
set -u
OUT=${OUT:-/tmp/replay-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
STEPS=${STEPS:-"tests overhead"}
py=python3
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  $py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/env.txt" 2>&1
step() {  # name, limit in seconds, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/steps.txt"
}
for s in $STEPS; do
  case $s in
    tests)  # one process per component: a crash names its component
      for c in layer_norm rms_norm attention mlp swiglu_mlp rope conv_bn lstm; do
        step "tests-$c" 120 $py -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
          tests/test_replay.py -k "dtype0-$c"
      done
      step tests-launch 120 $py -m pytest -m gpu -q -p no:cacheprovider tests/test_launch.py ;;
    tests-all) step tests-all 300 $py -X faulthandler -m pytest -m gpu -q -p no:cacheprovider tests/test_replay.py ;;
    tests-level4)  # every Level 4 GPU test, with the replay on (the default)
      step tests-level4 400 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_triton_layer_norm.py \
        tests/test_triton_attention.py tests/test_triton_attention_short.py tests/test_triton_mlp.py \
        tests/test_triton_conv_bn.py tests/test_triton_lstm.py tests/test_triton_rms_norm.py \
        tests/test_triton_rope.py tests/test_triton_swiglu_mlp.py tests/test_launch.py ;;
    tables)  # the training tables with the replay on (the default), baselines in the same run
      step table-gpt 200 $py -m equivalence train --model gpt --preset gpu --level 1,4,5 \
        --baseline torch --steps 20 --breakdown --out "$OUT/train-gpt"
      step table-cnn 120 $py -m equivalence train --model cnn --preset gpu --level 1,4,5 \
        --baseline torch --steps 20 --out "$OUT/train-cnn"
      step table-lstm 120 $py -m equivalence train --model lstm --preset gpu --level 1,4,5 \
        --baseline torch --steps 20 --out "$OUT/train-lstm"
      step table-gpt-amp 150 $py -m equivalence train --model gpt --preset gpu --level 1,4,5 \
        --baseline torch --steps 20 --amp bf16 --out "$OUT/train-gpt-amp" ;;
    overhead-45)  # Levels 4 and 5 in one run, eager beside them
      step overhead-45 300 $py -m equivalence bench --overhead --device cuda --level triton,cuda \
        --out "$OUT/overhead-levels-4-5.json" ;;
    suite)  # the model-shape suite at Level 4: end to end vs kernel time
      step suite 420 $py -m equivalence bench --suite models --device cuda --level triton \
        --out "$OUT/suite-models-level4.json" ;;
    final)  # after the last changes: Level 5 swiglu in C++, replay at both dtypes, compile
      step final-swiglu 230 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_cuda_swiglu_mlp.py
      step final-replay 170 $py -X faulthandler -m pytest -m gpu -q -p no:cacheprovider tests/test_replay.py
      step final-overhead 100 $py -m equivalence bench --overhead --device cuda --level triton,cuda \
        --component swiglu_mlp,mlp,layer_norm --out "$OUT/overhead-final.json"
      step final-compile 90 $py -m pytest -m gpu -q -p no:cacheprovider tests/test_models.py \
        -k whole_model_compile ;;
    last)  # the shared _serve and newton_schulz's replay
      step last-replay 220 $py -X faulthandler -m pytest -m gpu -q -p no:cacheprovider tests/test_replay.py
      step last-ns 150 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_triton_newton_schulz.py
      step last-overhead 120 $py -m equivalence bench --overhead --device cuda --level triton \
        --component newton_schulz,rms_norm,attention --out "$OUT/overhead-last.json" ;;
    norms5)  # Level 5 norms after the occupancy cache (common.cuh levels_occupancy_once)
      step norms5 300 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_cuda_rms_norm.py \
        tests/test_cuda_layer_norm.py ;;
    autocast)  # levels under torch.autocast on the GPU (the flag, not the context manager)
      step autocast 200 $py -m pytest -q -x -p no:cacheprovider tests/test_autocast.py ;;
    anatomy)  # where a tiny call's host time goes, by profiler event
      step anatomy 240 $py scripts/probe_call_anatomy.py "$OUT/anatomy.json" \
        --component rms_norm,swiglu_mlp,layer_norm,attention,conv_bn,mlp --level cuda,triton ;;
    anatomy-attention)  # attention's forward over eager's, beside layer_norm's, Python included
      step anatomy-attention 200 $py scripts/probe_call_anatomy.py "$OUT/anatomy-attention.json" \
        --component attention,layer_norm --level cuda,triton --python ;;
    lstm-amp)  # where eager Level 4's LSTM LM step loses 1.3 ms under --amp (issue #26's matrix
      # of 2026-11-27: 4.91 -> 6.56 ms eager, 4.43 -> 4.74 graphed): replay hits, host, GPU
      step probe-lstm-amp 200 $py scripts/probe_model_host.py "$OUT/probe-lstm-amp.json" --model lstm \
        --amp bf16 --runs triton,cuda,torch
      step probe-lstm-eager 150 $py scripts/probe_model_host.py "$OUT/probe-lstm-eager.json" \
        --model lstm --runs triton,torch ;;
    bench-rounds)  # the SwiGLU bench timed in rotated rounds (goals.figures_in_rounds), its first GPU run
      step bench-swiglu-rounds 300 $py -m equivalence bench --component swiglu_mlp --device cuda \
        --out "$OUT/bench-swiglu-rounds" ;;
    step-after)  # a step's time after its own step, a sleep, a busy host, busy GPU, native's step
      step after-lstm-amp 200 $py scripts/probe_step_after.py "$OUT/after-lstm-amp.json" --model lstm \
        --amp bf16 --runs triton,cuda,torch
      step after-lstm 100 $py scripts/probe_step_after.py "$OUT/after-lstm.json" --model lstm
      step after-gpt-amp 150 $py scripts/probe_step_after.py "$OUT/after-gpt-amp.json" --model gpt \
        --amp bf16 --runs triton,torch --repeats 9 ;;
    probe-models)  # wall vs GPU time per step, the GPU's top kernels and the host's top functions
      step probe-gpt-amp 200 $py scripts/probe_model_host.py "$OUT/probe-gpt-amp.json" --model gpt \
        --amp bf16 --runs triton,cuda,torch
      step probe-cnn 150 $py scripts/probe_model_host.py "$OUT/probe-cnn.json" --model cnn \
        --runs triton,cuda,torch
      step probe-lstm 150 $py scripts/probe_model_host.py "$OUT/probe-lstm.json" --model lstm \
        --runs triton,cuda,torch ;;
    gemm-mn)  # version 6 reads transposed operands as they lie (no copies in backward)
      step gemm-mn 330 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_cuda_mlp.py
      step anatomy-mn 120 $py scripts/probe_call_anatomy.py "$OUT/anatomy-mn.json" \
        --component mlp,swiglu_mlp --level cuda ;;
    swiglu-mn)
      step swiglu-mn 300 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_cuda_swiglu_mlp.py ;;
    probe-l5)  # the GPT at Level 5 after the copies went, and the CNN
      step probe-gpt-l5 200 $py scripts/probe_model_host.py "$OUT/probe-gpt-l5.json" --model gpt \
        --amp bf16 --runs cuda,triton,torch
      step probe-cnn 150 $py scripts/probe_model_host.py "$OUT/probe-cnn.json" --model cnn \
        --runs triton,cuda,torch ;;
    conv5)  # Level 5 conv_bn after the finalize kernels went parallel
      step conv5 400 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_cuda_conv_bn.py
      step probe-cnn5 120 $py scripts/probe_model_host.py "$OUT/probe-cnn5.json" --model cnn \
        --runs cuda,torch ;;
    matrix1-*)  # one training table, baselines in the same run: matrix1-<model>-<mode>[-amp],
      # <mode> eager, cuda-graph or compile; -amp: --amp bf16
      spec=${s#matrix1-}; model=${spec%%-*}; rest=${spec#*-}; mode=${rest%-amp}
      flag=""; [ "$mode" != eager ] && flag="--$mode"
      amp=""; [ "$rest" != "$mode" ] && amp=bf16
      step "table-$spec" 280 $py -m equivalence train --model "$model" --preset gpu --level 1,4,5 \
        --baseline torch --steps 20 $flag ${amp:+--amp $amp} --out "$OUT/table-$spec" ;;
    timeline)  # host clock vs GPU clock at each phase end of a full-size eager step, and the
      # synchronizing calls of a step; the GPT's top kernels per level (no --amp)
      step timeline-gpt 300 $py scripts/probe_step_timeline.py "$OUT/timeline-gpt.json" --model gpt \
        --runs triton,cuda,torch
      step timeline-cnn 200 $py scripts/probe_step_timeline.py "$OUT/timeline-cnn.json" --model cnn \
        --runs triton,cuda,torch
      step probe-gpt3 200 $py scripts/probe_model_host.py "$OUT/probe-gpt3.json" --model gpt \
        --runs triton,cuda,torch ;;
    lstm5)  # Level 5's LSTM after gemm.cu version 6
      step lstm5 300 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_cuda_lstm.py ;;
    sweeps)  # tiles at model shapes: the MLP's six GEMMs, layer_norm's backward at narrow widths
      step sweep-gemm 300 $py scripts/sweep_gemm_tiles.py "$OUT/sweep-gemm-gpt.json"
      step sweep-gemm-1000 200 $py scripts/sweep_gemm_tiles.py "$OUT/sweep-gemm-gpt-1000.json" --tokens 1000
      step sweep-ln-bwd 300 $py scripts/sweep_layer_norm_bwd_narrow.py "$OUT/sweep-ln-bwd.json" ;;
    tiles-tests)  # the GEMM tile rule (waves) and the norms' narrow-row backward tiling
      step tiles-tests 300 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_triton_mlp.py \
        tests/test_triton_layer_norm.py tests/test_triton_rms_norm.py ;;
    timeline-gpt)
      step timeline-gpt 300 $py scripts/probe_step_timeline.py "$OUT/timeline-gpt.json" --model gpt \
        --runs triton,cuda,torch ;;
    after-tests)  # everything the QKV GEMM, the (B, N, H, D) output and the tile rules touch
      step after-tests 330 $py -X faulthandler -m pytest -m gpu -q -x -p no:cacheprovider \
        tests/test_triton_attention.py tests/test_replay.py tests/test_triton_swiglu_mlp.py \
        tests/test_models.py tests/test_nn_cuda_graph.py -k "not nn_cuda_graph or attention" ;;
    after-tests2)  # the rest of after-tests (that call ran out of time after 54 passed)
      step after-tests2 260 $py -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
        tests/test_replay.py tests/test_triton_swiglu_mlp.py tests/test_models.py \
        tests/test_nn_cuda_graph.py -k "(not nn_cuda_graph or attention) and (not test_replay or forward_only) and not compile"
      step after-compile 150 $py -m pytest -m gpu -q -p no:cacheprovider tests/test_models.py -k "compile" ;;
    cnn-compile)  # the CNN compiled whole after _fast_div's int32 multiplier (not run yet on a GPU)
      step cnn-compile 300 $py -m pytest -q -p no:cacheprovider tests/test_models.py \
        tests/test_triton_conv_bn.py -k "(compile and cnn) or fast_div or divisors" ;;
    kernels-cnn-amp)  # the CNN's and the --amp GPT's top kernels and host functions per level
      step probe-cnn 120 $py scripts/probe_model_host.py "$OUT/probe-cnn.json" --model cnn \
        --runs triton,cuda,torch
      step probe-gpt-amp 180 $py scripts/probe_model_host.py "$OUT/probe-gpt-amp.json" --model gpt \
        --amp bf16 --runs triton,cuda,torch ;;
    probe-compile)  # the GPT compiled whole: wall vs GPU time, top kernels, host functions
      step probe-gpt-compile 300 $py scripts/probe_model_host.py "$OUT/probe-gpt-compile.json" \
        --model gpt --compile --runs native-compiled,triton,torch ;;
    probe-cnn-compile)  # the CNN compiled whole, the same way
      step probe-cnn-compile 200 $py scripts/probe_model_host.py "$OUT/probe-cnn-compile.json" \
        --model cnn --compile --runs native-compiled,triton,torch ;;
    cnn-stats)  # conv_bn's statistics from the conv's tiles and a 16-bit y: tests, kernels, table
      step conv-tests 180 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_triton_conv_bn.py
      step cnn-models 150 $py -m pytest -m gpu -q -p no:cacheprovider tests/test_models.py -k cnn
      step probe-cnn 60 $py scripts/probe_model_host.py "$OUT/probe-cnn.json" --model cnn \
        --runs triton,torch ;;
    sweep-wgrad)  # conv_wgrad's tiles and splits at the CNN's convolutions, cuDNN beside
      step sweep-wgrad 300 $py scripts/sweep_conv_wgrad.py "$OUT/sweep-conv-wgrad.json" ;;
    host-gpt)  # the GPT's host time per step, on a problem too small to hold the CPU back
      step host-gpt 200 $py scripts/probe_model_host.py "$OUT/host-gpt.json" --model gpt \
        --batch 1 --seq-len 16 --runs triton,triton-python,cuda,torch ;;
    gaps)  # where the GPT's GPU waits in a full-size eager step, and for which host op
      step gaps 300 $py scripts/probe_gpu_gaps.py "$OUT/gaps-gpt.json" --model gpt \
        --runs triton,torch,cuda ;;
    compile-breaks)  # every model compiled whole at Levels 1, 4, 5: no graph break at 4 and 5
      TORCH_LOGS=graph_breaks step compile-breaks 420 $py -m pytest -m gpu -q -p no:cacheprovider \
        tests/test_models.py -k whole_model_compile -s ;;
    lstm4)  # Level 4's LSTM after its barrier watch stepped aside under torch.compile
      step lstm4 200 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_triton_lstm.py ;;
    conv4)  # Level 4's conv weight gradient dividing by multiply-high: tests, the CNN step, its table
      step conv4 240 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_triton_conv_bn.py
      step probe-cnn4 120 $py scripts/probe_model_host.py "$OUT/probe-cnn4.json" --model cnn \
        --runs triton,torch
      step table-cnn4 120 $py -m equivalence train --model cnn --preset gpu --level 4 \
        --baseline torch --steps 20 --out "$OUT/table-cnn4" ;;
    host-anatomy)  # where the host time of the calls over their goal goes (2026-11-26, fifth)
      step anatomy-45 300 $py scripts/probe_call_anatomy.py "$OUT/anatomy-45.json" \
        --component attention,layer_norm,rms_norm,conv_bn --level cuda,triton
      step probe-cnn-amp 150 $py scripts/probe_model_host.py "$OUT/probe-cnn-amp.json" --model cnn \
        --amp bf16 --runs triton,torch ;;
    cnn-order)  # does the level that ran before change a CNN --amp run? Level 4 first, then Level 1
      step table-cnn-eager-amp-l4-first 200 $py -m equivalence train --model cnn --preset gpu \
        --level 4,5,1 --baseline torch --steps 20 --amp bf16 --out "$OUT/table-cnn-eager-amp-l4-first" ;;
    back-to-back)  # steps issued back to back vs synchronized one by one, and what blocks the host
      step b2b-cnn-amp 150 $py scripts/probe_back_to_back.py "$OUT/b2b-cnn-amp.json" --model cnn \
        --amp bf16 --runs triton,torch
      step b2b-cnn 150 $py scripts/probe_back_to_back.py "$OUT/b2b-cnn.json" --model cnn \
        --runs triton,torch ;;
    nograd)  # Level 5's forward-only calls without their autograd Function (autograd.cpp forward_only)
      step nograd-tests 240 $py -m pytest -m gpu -q -p no:cacheprovider tests/test_cuda_forward_only.py
      step nograd-check 200 $py -m equivalence check --level cuda --device cuda ;;
    sweep-fwd)  # conv_fwd (with training's tile statistics) and conv_dgrad tiles at the CNN's convs
      step sweep-fwd 420 $py scripts/sweep_conv_fwd.py "$OUT/sweep-conv-fwd.json" ;;
    sweep-fwd-oihw)  # the same with torch's default (OIHW) weights
      step sweep-fwd-oihw 420 $py scripts/sweep_conv_fwd.py "$OUT/sweep-conv-fwd-oihw.json" --weight-layout contiguous ;;
    kmajor)  # Level 4's training conv reads a (O, kH, kW, I) copy of an OIHW weight (_k_major)
      step kmajor-tests 300 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_triton_conv_bn.py
      step kmajor-replay 150 $py -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
        tests/test_replay.py -k conv_bn
      step kmajor-check 150 $py -m equivalence check --level triton --device cuda --component conv_bn ;;
    kmajor-layout)  # the K-major weight test on the GPU (replay on), and the OIHW sweep by its flag
      step kmajor-layout-test 120 $py -m pytest -q -p no:cacheprovider tests/test_triton_conv_bn.py \
        -k adjacent_input
      step sweep-fwd-oihw 420 $py scripts/sweep_conv_fwd.py "$OUT/sweep-conv-fwd-oihw.json" \
        --weight-layout contiguous ;;
    interleaved)  # levels train with its runs' steps interleaved: the eager tables, GPU model tests
      step models-gpu 300 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_models.py \
        -k "not compile" ;;
    host-cnn)  # the CNN's host time per step on a problem too small to hold the CPU back
      step host-cnn 150 $py scripts/probe_model_host.py "$OUT/probe-cnn-batch2.json" --model cnn \
        --batch 2 --runs triton,torch
      step host-cnn-amp 150 $py scripts/probe_model_host.py "$OUT/probe-cnn-batch2-amp.json" \
        --model cnn --batch 2 --amp bf16 --runs triton,torch ;;
    one-call)  # one signature read per Level 4 call (contract.one_call), ConvBN.forward's count in place
      step one-call-replay 240 $py -X faulthandler -m pytest -m gpu -q -p no:cacheprovider \
        tests/test_replay.py tests/test_validation_cache.py
      step one-call-host-cnn 150 $py scripts/probe_model_host.py "$OUT/probe-cnn-batch2.json" \
        --model cnn --batch 2 --runs triton,torch ;;
    one-call-compile)  # models compiled whole with contract.one_call in Level 4's path: no graph break
      step one-call-compile 400 $py -m pytest -m gpu -q -p no:cacheprovider tests/test_models.py -k compile ;;
    swiglu-forward-only)  # swiglu_mlp's save flag from records_autograd alone (review mend)
      step swiglu-fo 400 $py -m pytest -m gpu -q -x -p no:cacheprovider tests/test_cuda_forward_only.py \
        tests/test_cuda_swiglu_mlp.py -k "swiglu and (without_autograd or harness_tiny or strided or opcheck or compile)" ;;
    compile-ahead)
      step compile-ahead 200 $py -m pytest -m gpu -q -p no:cacheprovider tests/test_compile_ahead.py ;;
    probe-gpt) step probe-gpt 200 $py scripts/probe_model_host.py "$OUT/probe-gpt.json" --model gpt ;;
    overhead)
      step overhead 240 $py -X faulthandler -m equivalence bench --overhead --device cuda --level triton \
        --out "$OUT/overhead-replay.json"
      LEVELS_TRITON_REPLAY=0 step overhead-python 200 $py -m equivalence bench --overhead \
        --device cuda --level triton --out "$OUT/overhead-python.json" ;;
    train-gpt)
      step train-gpt 200 $py -m equivalence train --model gpt --preset gpu --level 1,4,5 \
        --baseline torch --steps 20 --out "$OUT/train-gpt"
      LEVELS_TRITON_REPLAY=0 step train-gpt-python 110 $py -m equivalence train --model gpt \
        --preset gpu --level 4 --steps 20 --out "$OUT/train-gpt-python" ;;
    train-cnn)
      step train-cnn 170 $py -m equivalence train --model cnn --preset gpu --level 1,4,5 \
        --baseline torch --steps 20 --out "$OUT/train-cnn"
      LEVELS_TRITON_REPLAY=0 step train-cnn-python 90 $py -m equivalence train --model cnn \
        --preset gpu --level 4 --steps 20 --out "$OUT/train-cnn-python" ;;
  esac
done
tar czf "$OUT/replay.tar.gz" -C "$OUT" --exclude replay.tar.gz . 2>/dev/null
