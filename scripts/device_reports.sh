#!/usr/bin/env bash
# The recorded reference results for people without a GPU: `reports/h100/`.
# One device call runs the README's own commands, on cold caches, exactly as a new user would:
#
#   OUT=dir bash scripts/device_reports.sh [compare] [profile] [select]
#
#   compare  `levels compare` with its defaults (bf16, bench size, every level), with empty
#            Inductor, Triton and Level 5 build caches, timed end to end; its stdout is kept
#            (compare-stdout.txt) to show that it prints only our progress and table.
#   profile  `levels profile --component C` for every component (every level, defaults).
#   select   `levels select` (the level="auto" decision table).
#
# Everything lands in $OUT/h100/; the lead copies it to reports/h100/ and commits it.
# timings.json records each command, its exit code and wall time, the GPU, driver, versions.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output directory}"
dest="$OUT/h100"
mkdir -p "$dest"
cold=$(mktemp -d)
# cold caches: nothing compiled, autotuned or built before this run
export TORCHINDUCTOR_CACHE_DIR="$cold/inductor" TRITON_CACHE_DIR="$cold/triton" LEVELS_CUDA_CACHE="$cold/cuda"
export LEVELS_CACHE_DIR="$cold/levels"
records=()
elapsed() { local ms=$(( ($(date +%s%N) - $1) / 1000000 )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }
record() {  # name, exit code, seconds, command
  records+=("{\"step\": \"$1\", \"exit\": $2, \"wall_s\": $3, \"command\": \"$4\"}")
}
for step in ${*:-compare profile select}; do
  case $step in
    compare)
      start=$(date +%s%N)
      timeout 330 python3 -m equivalence compare --out "$dest" > "$dest/compare-stdout.txt" 2>&1
      rc=$?
      record compare $rc "$(elapsed "$start")" "levels compare --out reports/h100"
      tail -n 30 "$dest/compare-stdout.txt" ;;
    profile)
      for c in attention layer_norm mlp lstm conv_bn; do
        start=$(date +%s%N)
        timeout 100 python3 -m equivalence profile --component "$c" --out "$dest" > "$dest/profile-$c-stdout.txt" 2>&1
        rc=$?
        record "profile $c" $rc "$(elapsed "$start")" "levels profile --component $c --out reports/h100"
        tail -n 12 "$dest/profile-$c-stdout.txt"
      done ;;
    select)
      start=$(date +%s%N)
      timeout 200 python3 -m equivalence select > "$dest/select-stdout.txt" 2>&1
      rc=$?
      record select $rc "$(elapsed "$start")" "levels select"
      tail -n 20 "$dest/select-stdout.txt" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
versions=$(python3 -c "import torch, triton, platform; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, Python {platform.python_version()}')")
{
  echo "{\"gpu\": \"$gpu\", \"versions\": \"$versions\", \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo " \"caches\": \"cold: empty Inductor, Triton, Level 5 build and level-selection caches\","
  echo " \"regenerate\": \"OUT=. bash scripts/device_reports.sh (then copy h100/ to reports/h100/)\","
  echo " \"steps\": [$(IFS=,; echo "${records[*]}")]}"
} > "$dest/timings.json"
cat "$dest/timings.json"
