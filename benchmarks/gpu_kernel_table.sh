#!/usr/bin/env bash
# The INT8 kernel table on the GPU machine with comfy-kitchen: a device call of its own, carrying only
# the kernel kit (comfy-kitchen does not fit beside the device kit in one call's 64 MiB).
#
#   bash benchmarks/gpu_kernel_table.sh --kernels device-kernels          # on the GPU machine
#   bash benchmarks/gpu_kernel_table.sh --kernels KIT --cpu [RESULTS]      # the CPU rehearsal
#
# --kernels DIR  the kernel kit (python -m benchmarks.kernel_kit build): checked and installed with
#                pip --no-index into SITE, then used with the machine's own python3 and torch
# --cpu          no GPU: mid-LTXV shapes at 64 rows (TOKENS), no second table, on the CPU
# RESULTS        working folder (default: a new folder under $TMPDIR or /tmp, printed)
# Settings (environment):
#   SITE=.device-kernels  where the kit is installed: a git-ignored folder of the repository, which the
#                         GPU machine keeps while it stays warm, so that gpu_seed_table.sh, run as the
#                         next call, finds comfy-kitchen there and its matrix's auto can choose it
#   TOKENS=4096           activation rows of the table (also ROWS2=16384 for a second, larger table)
#   RUNS=9                timed calls per kernel and shape (3 with --cpu)
#   FUSED_MODE=           set (max-autotune-no-cudagraphs), a table of the LTXV-13B shapes (FUSED_MODELS)
#                         with int_mm_fused compiled in that torch.compile mode runs right after the first
#                         table, in place of the ROWS2 one (a call hands back 8 files at most): inductor
#                         then times its own int8 Triton matmuls against cuBLAS and may fuse the rescale
#                         into the winner; it compiles for minutes
#   BUDGET_S=270          the whole call's seconds: a table that would not end 15 s before it is cut
#                         short or left out (named at the end), so that the hand-back always happens
#                         inside a device call's timeout_s of 300
#   PYTHON=python3
#
# 1. install the kit; import comfy-kitchen from it (when it does not import, the table goes on without it)
# 2. the GPU (nvidia-smi); per LTXV-13B, Wan-14B and mid-LTXV shape, each kernel (w8a16, int_mm,
#    int_mm_fused, kitchen), torch._int_mm alone and auto against the bf16 matmul, with SQNR against fp32: plain rows, then ConvRot rows
#    (comfy-kitchen rotating in its own kernel), then plain rows at ROWS2
# 3. hand back int8_linear*.txt, int8_kernels*.json, int8_linear.json and log.txt into $OUT when it is
#    set, else into RESULTS/handback (8 files at most)
# Exit status: 0 when every table was made, 1 when one failed, 2 a bad option, 3 the kit does not
# install, 4 no torch or no CUDA without --cpu.
set -uo pipefail
cd "$(dirname "$0")/.."
KERNELS_KIT="" CPU=0 RESULTS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kernels) KERNELS_KIT="${2:?--kernels needs a folder}"; shift 2 ;;
    --cpu) CPU=1; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set /!p;}' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (--kernels DIR, --cpu)" >&2; exit 2 ;;
    *) RESULTS="$1"; shift ;;
  esac
done
[ -n "$KERNELS_KIT" ] || { echo "--kernels DIR is required (python -m benchmarks.kernel_kit build)" >&2; exit 2; }
START=$(date +%s) BUDGET_S="${BUDGET_S:-270}"
PY="${PYTHON:-python3}" SITE="${SITE:-$PWD/.device-kernels}"
if [ "$CPU" = 1 ]; then
  DEVICE=cpu TOKENS="${TOKENS:-64}" ROWS2="${ROWS2:-}" MODELS=ltxv-mid RUNS="${RUNS:-3}"
else
  DEVICE=cuda TOKENS="${TOKENS:-4096}" ROWS2="${ROWS2:-16384}" MODELS=ltxv-13b,wan-14b,ltxv-mid RUNS="${RUNS:-9}"
fi
RESULTS="${RESULTS:-${TMPDIR:-/tmp}/leanvideo-kernels-$(date -u +%Y%m%d-%H%M%S)}"
HANDBACK="${OUT:-$RESULTS/handback}"
mkdir -p "$RESULTS" "$HANDBACK"
LOG="$RESULTS/log.txt"
exec 3>&1 4>&2
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
FAILED=()  # the tables that failed, said at the end and in the exit status
finish() {
  echo "== 3. hand back: $HANDBACK (done in $(($(date +%s) - START)) s)"
  # each table's text and JSON went back as it ended (table below): the record and the log remain
  [ -f "$RESULTS/int8_linear.json" ] && cp "$RESULTS/int8_linear.json" "$HANDBACK/"
  if [ ${#FAILED[@]} -gt 0 ]; then
    echo "FAILED: ${FAILED[*]}"
  fi
  # the tee may still be writing the last lines: stop feeding it and let it end (2 s at most: a process
  # still holding the pipe would keep it open) before the log is copied
  exec 1>&3 2>&4
  for _ in $(seq 20); do kill -0 "$TEE_PID" 2>/dev/null || break; sleep 0.1; done
  cp "$LOG" "$HANDBACK/log.txt"
  [ ${#FAILED[@]} -eq 0 ] || exit 1
}
trap finish EXIT

echo "== 1. kernel kit $KERNELS_KIT -> $SITE ($("$PY" -V))"
exports=$("$PY" -m benchmarks.kernel_kit install "$KERNELS_KIT" --into "$SITE") || exit 3
eval "$exports"
export PYTHONPATH
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' || exit 4
if [ "$CPU" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "no CUDA device here (torch.cuda.is_available() is False): --cpu runs the CPU rehearsal" >&2
  exit 4
fi
"$PY" -c 'import comfy_kitchen, importlib.metadata as m
print("comfy-kitchen", m.version("comfy-kitchen"), "from", comfy_kitchen.__file__)' ||
  echo "comfy-kitchen does not import here (above): the table runs without the kitchen kernel"

if [ "$CPU" = 1 ]; then
  echo "== 2. INT8 linear layers on the CPU (--cpu: $MODELS, $TOKENS rows)"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "== 2. INT8 linear layers: each kernel and auto vs bf16 on the GPU"
fi
table() {  # table NAME [int8_bench options…]; its files are handed back as soon as it ends
  local name="$1" limit=$(($(left) - 15)); shift
  # 150 s at most: the first table also compiles int_mm_fused (Triton, a cold cache); later ones reuse it
  [ "$limit" -le 150 ] || limit=150
  if [ "$limit" -lt 20 ]; then
    echo "table$name: skipped, $(left) s of the $BUDGET_S s budget left"
    FAILED+=("table$name (no time left)")
    return
  fi
  timeout "$limit" "$PY" -u benchmarks/int8_bench.py --skip-files --device "$DEVICE" --linear-models "$MODELS" \
    --runs "$RUNS" "$@" --json "$RESULTS/int8_kernels$name.json" \
    >"$RESULTS/int8_linear$name.txt" 2>&1 || { echo "int8_bench$name failed or timed out"; FAILED+=("table$name"); }
  grep -A50 "^linear on" "$RESULTS/int8_linear$name.txt" || tail -5 "$RESULTS/int8_linear$name.txt"
  for file in "$RESULTS/int8_linear$name.txt" "$RESULTS/int8_kernels$name.json"; do
    [ -f "$file" ] && cp "$file" "$HANDBACK/"
  done
  cp "$LOG" "$HANDBACK/log.txt"  # so far: if the device call's own limit stops this script, it is back
}
table "" --tokens "$TOKENS" --out "$RESULTS/int8_linear.json"
if [ -n "${FUSED_MODE:-}" ]; then
  table "_fused_mode" --tokens "$TOKENS" --linear-models "${FUSED_MODELS:-ltxv-13b}" --fused-mode "$FUSED_MODE"
  ROWS2=""
fi
table "_convrot" --tokens "$TOKENS" --convrot
[ -z "$ROWS2" ] || table "_$ROWS2" --tokens "$ROWS2"
