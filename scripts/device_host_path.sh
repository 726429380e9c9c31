#!/usr/bin/env bash
# The host-path work's device run, one call: Level 5 built cold (its time), Levels 4 and 5
# checked by the harness at every dtype, layout and variant, their GPU tests, and the probe
# of where a call's host time goes (scripts/probe_host_path.py). Each step has its own time
# limit and its log under $OUT, so a step that runs out of time loses only itself.
#
#   OUT=dir bash scripts/device_host_path.sh [build] [check] [tests] [probe] [backward] [suite]
#                                            [bench] [badinputs] [overhead] [train]
#
#   TESTS="files..."      the GPU tests to run (default: Level 5's and the launch path's)
#   TRAIN="gpt:eager ..." the training tables (model:mode[:amp]), each its own `levels train`
#   BENCH="rms_norm ..."  the components whose `levels bench` to run
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
exec > >(tee "$OUT/run.log") 2>&1
export LEVELS_CUDA_CACHE="${LEVELS_CUDA_CACHE:-$(mktemp -d)}"  # cold: the first step builds
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for step in ${*:-build check tests probe}; do
  start=$(date +%s)
  case $step in
    build) timeout 240 python3 -m cuda_kernels.build ;;
    check) timeout 240 python3 -m equivalence check --device cuda --dtype fp32,fp16,bf16 \
             --level 4,5 --json "$OUT/check45.json" --log "$OUT/check.log" | tail -n 25 ;;
    tests) timeout "${TESTS_LIMIT:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -rf --maxfail=8 \
             ${TESTS:-tests/test_cuda_build.py tests/test_cuda_layer_norm.py tests/test_cuda_attention.py \
             tests/test_cuda_mlp.py tests/test_cuda_lstm.py tests/test_cuda_conv_bn.py tests/test_launch.py \
             tests/test_compile_ahead.py} > "$OUT/tests.txt" 2>&1; tail -n 12 "$OUT/tests.txt" ;;
    probe) timeout 200 python3 scripts/probe_host_path.py > "$OUT/probe.txt" 2>&1; echo "probe exit $?"
           grep -B2 -A40 "== components" "$OUT/probe.txt" | head -n 60 ;;
    backward) timeout 150 python3 scripts/probe_backward_host.py > "$OUT/probe_backward.txt" 2>&1
              echo "backward probe exit $?"; tail -n 60 "$OUT/probe_backward.txt" ;;
    suite) timeout "${SUITE_LIMIT:-300}" python3 -m equivalence bench --suite models --device cuda \
             --out "$OUT/h100-suite-models.json" > "$OUT/suite.txt" 2>&1; echo "suite exit $?"; tail -n 40 "$OUT/suite.txt" ;;
    bench)  # BENCH="component ...": each one's `levels bench` (its goals), JSON per component
      for c in ${BENCH:-layer_norm}; do
        timeout "${BENCH_LIMIT:-150}" python3 -m equivalence bench --component "$c" --device cuda \
          --out "$OUT/bench-$c" > "$OUT/bench-$c.txt" 2>&1; echo "bench $c: exit $?"; tail -n 30 "$OUT/bench-$c.txt"
      done ;;
    badinputs) timeout "${BAD_LIMIT:-240}" python3 -m tests.test_bad_inputs --gpu-report "$OUT/bad-inputs-gpu.json" \
                 > "$OUT/bad-inputs.txt" 2>&1; echo "bad inputs exit $?"; tail -n 15 "$OUT/bad-inputs.txt" ;;
    overhead) timeout 200 python3 -m equivalence bench --overhead --device cuda \
                --out "$OUT/h100-overhead.json" 2>&1 | tail -n 45 ;;
    train)  # one `levels train` per table, every level and the plain-torch model
      mkdir -p "$OUT/train"
      for table in ${TRAIN:-gpt:eager gpt:cuda-graph gpt:compile}; do
        IFS=: read -r model mode amp <<< "$table"
        flags=(--model "$model" --preset gpu --level all --baseline torch --steps "${STEPS:-30}")
        [ "$mode" = compile ] && flags+=(--compile)
        [ "$mode" = cuda-graph ] && flags+=(--cuda-graph)
        [ -n "$amp" ] && flags+=(--amp "$amp")
        t0=$(date +%s)
        timeout "${TABLE_LIMIT:-240}" python3 -m equivalence train "${flags[@]}" --out "$OUT/train" \
          > "$OUT/train/$model-$mode${amp:+-$amp}-stdout.txt" 2>&1
        echo "train $table: exit $? after $(( $(date +%s) - t0 )) s"
        tail -n 14 "$OUT/train/$model-$mode${amp:+-$amp}-stdout.txt"
      done
      tar -czf "$OUT/train.tar.gz" -C "$OUT" train && rm -rf "$OUT/train" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
done
