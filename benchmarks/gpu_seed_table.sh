#!/usr/bin/env bash
# The seed-table benchmark on an NVIDIA GPU machine with no downloads, inside a time budget.
#
#   bash benchmarks/gpu_seed_table.sh [OUT_DIR]
#
# Needs `python3 install.py` done (venv + pinned ComfyUI) and about 30 GB of free disk per family.
# Settings (environment):
#   FAMILIES="ltxv-13b"   families to run, in order (add wan-14b: its 20-step baseline alone is minutes)
#   REPEATS=1 WARMUPS=1   per variant; the warmup takes the first load and any compilation
#   BUDGET_S=600          whole-script budget; a family that cannot start with 120 s left is skipped
#   KEEP=0                1 keeps the synthetic model files after the run (they are ≈ 26 GB per family)
#   BENCH_ARGS=""         more `leanvideo bench` options, e.g. "--set 9.length=65" (fewer LTXV frames)
#
# 1. Linear layers: W8A8 and W8A16 against bf16 at LTXV-13B and Wan-14B shapes, on the GPU
#    (benchmarks/int8_bench.py; 4096 activation rows, about a video DiT's token count per frame chunk).
# 2. Per family: full-size random-weight models written on the GPU under the release file names
#    (python -m benchmarks.synth_models; files that are not synthetic are never touched), then the
#    real-size matrix (seed_table.toml / seed_table_wan.toml) with real CUDA peaks, NVML energy, and
#    the compile and attention variants actually run; then the synthetic files are removed.
# Everything lands in OUT_DIR: gpu.csv, int8_linear.{json,txt}, <family>/report.md, CSV, plots, runs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench-gpu-$(date -u +%Y%m%d-%H%M%S)}"
FAMILIES="${FAMILIES:-ltxv-13b}"
REPEATS="${REPEATS:-1}"
WARMUPS="${WARMUPS:-1}"
BUDGET_S="${BUDGET_S:-600}"
KEEP="${KEEP:-0}"
read -r -a BENCH_EXTRA <<<"${BENCH_ARGS:-}"
PY=.venv/bin/python
START=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.csv"
df -h . | tee "$OUT/disk.txt"

echo "== 1. linear layers: W8A8 / W8A16 vs bf16 on the GPU ($(left) s left)"
timeout 120 "$PY" benchmarks/int8_bench.py --skip-files --device cuda --tokens 4096 \
  --out "$OUT/int8_linear.json" >"$OUT/int8_linear.txt" || echo "int8_bench failed or timed out"
grep -A12 "^linear on" "$OUT/int8_linear.txt" || true

for family in $FAMILIES; do
  case "$family" in
    ltxv-13b) matrix=benchmarks/seed_table.toml ;;
    wan-14b) matrix=benchmarks/seed_table_wan.toml ;;
    *) echo "unknown family $family (ltxv-13b, wan-14b)" >&2; exit 2 ;;
  esac
  if [ "$(left)" -lt 120 ]; then
    echo "== $family: skipped, $(left) s of the ${BUDGET_S} s budget left"
    continue
  fi
  echo "== 2. $family: synthetic full-size models on the GPU ($(left) s left)"
  timeout "$(left)" "$PY" -m benchmarks.synth_models "$family" --device cuda | tee "$OUT/synth-$family.txt"
  echo "== 2. $family: $matrix, $WARMUPS warmup + $REPEATS repeat(s) per variant ($(left) s left)"
  # --budget-s: no run starts once the budget is used (the report covers what ran); the last run
  # and the report get the remaining 60 s, and `timeout` is only the hard stop.
  status=0
  timeout "$(left)" .venv/bin/leanvideo bench "$matrix" --out "$OUT/$family" \
    --repeats "$REPEATS" --warmups "$WARMUPS" --budget-s "$(($(left) - 60))" "${BENCH_EXTRA[@]}" || status=$?
  [ "$status" -eq 0 ] || echo "$family: bench exited $status (124: out of budget)"
  [ -f "$OUT/$family/report.md" ] && cat "$OUT/$family/report.md"
  if [ "$KEEP" != 1 ]; then
    "$PY" -m benchmarks.synth_models "$family" --remove
  fi
done
echo "done in $(($(date +%s) - START)) s; results in $OUT"
