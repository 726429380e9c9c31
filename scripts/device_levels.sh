#!/usr/bin/env bash
# The lead's device run, one call: the GPU-marked tests (Level 4 kernels at fp16/bf16/fp32
# and odd sizes), Levels 1-3 checked on the GPU at fp32/fp16/bf16,
# and `levels compare` at bench size. Each step has its own time limit and writes its own
# JSON as soon as it ends, so a step that runs out of time loses only itself.
#
#   OUT=dir bash scripts/device_levels.sh [tests] [checks12] [checks3] [explain] [compare] [bench]
#
#   LEVEL3_DTYPES=fp16   checks3 at these dtypes only (default fp32,fp16,bf16)
#   BENCH=mlp,lstm       bench these components only (default all); BENCH_LIMIT seconds
#
# Measured on an H100 (2026-11-21): checks12 19 s; tests, checks3 and compare each need more
# than 150 s (Inductor and Triton compiles dominate). The limits below add up to more than
# one call's 10 minutes: run `tests checks3 explain` in one call and `compare` in another.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
# --repeat 2: TorchScript runs its fused graph from the second call with a shape on
check=(python -m equivalence check --device cuda --dtype fp32,fp16,bf16 --size small --repeat 2)
for step in ${*:-tests checks12 checks3 explain compare}; do
  start=$(date +%s)
  case $step in
    tests)    timeout "${TESTS_LIMIT:-200}" python -m pytest -q -m gpu tests -p no:cacheprovider -rf | tail -n 40 ;;
    checks12) timeout 60 "${check[@]}" --level 1,2 --json "$OUT/check-levels12.json" | tail -n 5 ;;
    checks3)  timeout 200 "${check[@]}" --level 3 --dtype "${LEVEL3_DTYPES:-fp32,fp16,bf16}" \
                --json "$OUT/check-level3.json" | tail -n 5 ;;
    explain)  # the compiled-kernel summaries (registers, spills, HGMMA...) of every Level 4 kernel
      for c in attention layer_norm mlp lstm conv_bn; do
        timeout 40 python -m equivalence explain --component "$c" --level triton --device cuda \
          >> "$OUT/explain-triton.txt" 2>&1; echo "explain $c: exit $?"
      done; grep -h -A2 "^  \[" "$OUT/explain-triton.txt" | head -n 60 ;;
    compare)  # default Inductor mode: max-autotune would spend minutes autotuning GEMMs
      LEVELS_COMPILE_MODE=default timeout 300 python -m equivalence compare --device cuda \
        --size bench --check-size tiny --dtype bf16 --level 1,2,3,4 --out "$OUT/compare" ;;
    bench)    timeout "${BENCH_LIMIT:-300}" python -m equivalence bench --device cuda \
                ${BENCH:+--component "$BENCH"} --out "$OUT/bench" 2>&1 | tail -n 60 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
done
