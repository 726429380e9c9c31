#!/usr/bin/env bash
# The lead's device run, one call: the GPU-marked tests (Level 4 kernels at fp16/bf16/fp32
# and odd sizes, issues 4-5), Levels 1-3 checked on the GPU at fp32/fp16/bf16 (issue 3),
# and `levels compare` at bench size. Each step has its own time limit and writes its own
# JSON as soon as it ends, so a step that runs out of time loses only itself.
#
#   OUT=dir bash scripts/device_levels.sh [tests] [checks12] [checks3] [compare]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
# --repeat 2: TorchScript runs its fused graph from the second call with a shape on
check=(python -m equivalence check --device cuda --dtype fp32,fp16,bf16 --size small --repeat 2)
for step in ${*:-tests checks12 checks3 compare}; do
  start=$(date +%s)
  case $step in
    tests)    timeout 150 python -m pytest -q -m gpu tests -p no:cacheprovider | tail -n 40 ;;
    checks12) timeout 60 "${check[@]}" --level 1,2 --json "$OUT/check-levels12.json" | tail -n 5 ;;
    checks3)  timeout 150 "${check[@]}" --level 3 --json "$OUT/check-level3.json" | tail -n 5 ;;
    compare)  # default Inductor mode: max-autotune would spend minutes autotuning GEMMs
      LEVELS_COMPILE_MODE=default timeout 150 python -m equivalence compare --device cuda \
        --size bench --check-size tiny --dtype bf16 --level 1,2,3,4 --out "$OUT/compare" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
done
