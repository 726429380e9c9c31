#!/usr/bin/env bash
# The device run for the components of a modern LLM (rms_norm, rope, swiglu_mlp), attention
# grown (grouped-query heads, head sizes to 256, causal alignments, kv_lens, empty inputs),
# the grader's Level 5 markers and performance points, and the Llama model: the Level 5
# library built cold (its time), Levels 4 and 5 checked by the harness at every dtype, the GPU
# tests of what changed. Each step has its own time limit and log; everything under $OUT is
# packed into one archive at the end (the device returns at most 8 files).
#
#   OUT=dir bash scripts/device_new_components.sh [build] [check] [tests]
#   (then scripts/device_host_path.sh bench badinputs train for the figures)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
exec > >(tee "$OUT/run.log") 2>&1
export LEVELS_CUDA_CACHE="${LEVELS_CUDA_CACHE:-$(mktemp -d)}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for step in ${*:-build check tests}; do
  start=$(date +%s)
  case $step in
    build) timeout 240 python3 -m cuda_kernels.build ;;
    check) for c in ${COMPONENTS:-rms_norm rope swiglu_mlp attention}; do
             timeout "${CHECK_LIMIT:-150}" python3 -m equivalence check --component "$c" --device cuda \
               --dtype fp32,fp16,bf16 --level 4,5 --json "$OUT/check-$c.json" --log "$OUT/check-$c.log" \
               > "$OUT/check-$c.txt" 2>&1; echo "check $c: exit $?"; tail -n 6 "$OUT/check-$c.txt"
           done ;;
    tests) timeout "${TESTS_LIMIT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider -rf --maxfail=30 \
             ${TESTS:-tests/test_triton_rms_norm.py tests/test_cuda_rms_norm.py tests/test_triton_rope.py \
             tests/test_cuda_rope.py tests/test_triton_swiglu_mlp.py tests/test_cuda_swiglu_mlp.py} \
             > "$OUT/tests.txt" 2>&1; tail -n 40 "$OUT/tests.txt" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
done
cd "$OUT" && tar -czf all.tar.gz --exclude=all.tar.gz . && ls -la all.tar.gz
