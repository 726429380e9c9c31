#!/usr/bin/env bash
# The device run that closes the LLM-components work (issues #30, #31, #32): each step with its
# own time limit and its output under $OUT, packed into one archive at the end (the device
# returns at most eight files).
#
#   OUT=dir bash scripts/device_finish_llm.sh STEP...
#
#   build       Level 5 built cold (its time)
#   attention   the GPU tests of attention at Levels 4 and 5 (rope=, grouped-query heads on
#               the tensor cores), `levels check` of attention at Levels 4-5
#   empty       the GPU tests of empty batches at every level
#   probe       scripts/probe_attention_rope_gqa.py: rope fused vs alone, Level 5 v3-v5 with GQA
#   grading     the grader's Level 5 rules: reference full marks, the planted cheats 0
#   bench       BENCH="component ...": each one's `levels bench`
#   ns          newton_schulz: GPU tests (Levels 4, 5, Muon), `levels check` at Levels 4-5
#   train       TRAIN="model:mode[:optimizer]": `levels train --preset gpu --level all --baseline torch`
#   badinputs   the bad-input GPU report
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
exec > >(tee "$OUT/run.log") 2>&1
export LEVELS_CUDA_CACHE="${LEVELS_CUDA_CACHE:-$(mktemp -d)}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
gpu_tests() {  # name limit pytest-args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider -rf --maxfail=10 "$@" \
    > "$OUT/tests-$name.txt" 2>&1
  echo "tests $name: exit $?"; grep -E "passed|failed|error" "$OUT/tests-$name.txt" | tail -n 12
}
for step in "$@"; do
  start=$(date +%s)
  case $step in
    build) timeout 240 python3 -m cuda_kernels.build | tail -n 3 ;;
    attention)
      gpu_tests attention "${ATTN_LIMIT:-300}" ${ATTN_TESTS:-tests/test_cuda_attention.py tests/test_triton_attention.py} \
        ${ATTN_K:+-k "$ATTN_K"}
      timeout 150 python3 -m equivalence check --component attention --device cuda \
        --dtype fp16,bf16 --level 4,5 --json "$OUT/check-attention.json" | tail -n 8 ;;
    empty) gpu_tests empty 150 tests/test_empty_tensors.py ;;
    probe) timeout 200 python3 scripts/probe_attention_rope_gqa.py "$OUT/attention-rope-gqa.json" ;;
    grading) gpu_tests grading 240 tests/test_grading.py -k "cuda_reference or cuda_level_gives" ;;
    bench)
      for c in ${BENCH:-attention}; do
        timeout "${BENCH_LIMIT:-200}" python3 -m equivalence bench --component "$c" --device cuda \
          --out "$OUT/bench-$c" > "$OUT/bench-$c.txt" 2>&1; echo "bench $c: exit $?"
        grep -E "rope|fused|goal|met|yes|no " "$OUT/bench-$c.txt" | cut -c1-180 | tail -n 30
      done ;;
    ns)
      gpu_tests newton_schulz "${NS_LIMIT:-150}" tests/test_triton_newton_schulz.py tests/test_cuda_newton_schulz.py tests/test_optim_muon.py
      timeout 120 python3 -m equivalence check --component newton_schulz --device cuda \
        --dtype fp32,bf16 --level 4,5 --json "$OUT/check-newton-schulz.json" | tail -n 8 ;;
    train)
      mkdir -p "$OUT/train"
      for table in ${TRAIN:-llama:eager}; do
        IFS=: read -r model mode opt <<< "$table"
        flags=(--model "$model" --preset gpu --level all --baseline torch --steps "${STEPS:-20}")
        [ "$mode" = compile ] && flags+=(--compile)
        [ "$mode" = cuda-graph ] && flags+=(--cuda-graph)
        [ -n "$opt" ] && flags+=(--optimizer "$opt")
        timeout "${TABLE_LIMIT:-240}" python3 -m equivalence train "${flags[@]}" --out "$OUT/train" \
          > "$OUT/train/$model-$mode${opt:+-$opt}-stdout.txt" 2>&1
        echo "train $table: exit $?"; tail -n 12 "$OUT/train/$model-$mode${opt:+-$opt}-stdout.txt"
      done ;;
    badinputs) timeout "${BAD_LIMIT:-240}" python3 -m tests.test_bad_inputs --gpu-report \
                 "$OUT/bad-inputs-gpu.json" > "$OUT/bad-inputs.txt" 2>&1
               echo "bad inputs: exit $?"; tail -n 3 "$OUT/bad-inputs.txt" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step after $(( $(date +%s) - start )) s"
done
tar -czf "$OUT/all.tar.gz" -C "$OUT" --exclude=all.tar.gz --exclude=run.log . 2>/dev/null
find "$OUT" -mindepth 1 -maxdepth 1 ! -name all.tar.gz ! -name run.log -exec rm -rf {} +
