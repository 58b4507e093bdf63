#!/usr/bin/env bash
# The GPU proof: the seed's optimisation table on an NVIDIA GPU, with no downloads, inside a time budget.
#
#   bash benchmarks/gpu_seed_table.sh --kit device-kit      # on the GPU machine (no network, no install)
#   bash benchmarks/gpu_seed_table.sh                       # where `python3 install.py` was run
#   bash benchmarks/gpu_seed_table.sh --kit KIT --cpu       # the CPU rehearsal: tiny matrix, same path
#
# --kit DIR  install the device kit (python -m benchmarks.device_kit build) into a temporary folder
#            with pip --no-index and run from it with the machine's own python3 and torch;
#            without it, the venv and ComfyUI of `python3 install.py`
# --cpu      no GPU: FAMILIES defaults to the tiny matrix and the kernel table is left out
# RESULTS    working folder (default: a new folder under $TMPDIR or /tmp, printed)
# Settings (environment):
#   FAMILIES="ltxv-13b"   in order: ltxv-13b (≈ 40 GB of full-size random weights), wan-14b (≈ 22 GB),
#                         wan22-14b (Wan 2.2 A14B, two experts, ≈ 37 GB), tiny; each family's files are
#                         removed before the next one is written (KEEP=0)
#   BUDGET_S=540          whole-script budget, kit install included; the report is written when it ends
#   RUN_RESERVE_S=150     no benchmark run starts later than this before the budget's end (20 with --cpu)
#   REPEATS=1 WARMUPS=1   per variant; the warmup takes the first load and any compilation
#   KEEP=0                1 keeps the synthetic model files after the run
#   BENCH_ARGS=""         more `leanvideo bench` options, e.g. "--set 9.length=65" (fewer LTXV frames),
#                         "--variant 8-step-attention-acceleration --baseline 8-step-distill --server-warmups 1"
#   KERNELS=1             0 leaves out the INT8 linear-layer table
#   TESTS=1               0 leaves out the GPU tests (pytest -m gpu on the INT8 and attention tests)
#   KERNELS_SITE=.device-kernels  comfy-kitchen installed by an earlier call on this machine
#                         (benchmarks/gpu_kernel_table.sh --kernels device-kernels); used when present
#   PYTHON=python3        the interpreter used with --kit
#
# 0. The device kit, and comfy-kitchen when the kernel kit's call left it on this machine (the GPU
#    machine keeps a call's ignored folders while it stays warm): then the kitchen kernel is a
#    candidate of auto in the table and in every server of the matrix.
# 1. The GPU (nvidia-smi), the GPU tests, and the INT8 linear-layer table: each INT8 kernel and auto's choice against
#    bf16 at LTXV-13B, Wan-14B and mid-LTXV shapes (benchmarks/int8_bench.py, 4096 activation rows);
#    the matrix's auto choices are read from the bench servers' kernel tables by proof_report.
# 2. Per family: full-size random-weight models written on the GPU under the release file names
#    in their release forms (python -m benchmarks.synth_models; the loaders quantize them on load, so a
#    cold run includes load + quantize), then its matrix (seed_table.toml, seed_table_wan.toml,
#    seed_table_wan22.toml or seed_table_tiny.toml) with real CUDA peaks, NVML energy, the compile and
#    attention variants.
# 3. Always, even when time ran out or a step failed: python -m benchmarks.proof_report hands back
#    summary.json, report.md, log.txt, the CSVs and the plots (8 files at most) into $OUT when it is
#    set, else into RESULTS/handback.
# Exit status: 0 when every step ran, 1 when one failed (named at the end), 2 a bad option or family,
# 3 the kit does not install, 4 no CUDA without --cpu.
set -uo pipefail
cd "$(dirname "$0")/.."
KIT="" CPU=0 RESULTS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kit) KIT="${2:?--kit needs a folder}"; shift 2 ;;
    --cpu) CPU=1; shift ;;
    -h | --help) sed -n '2,/^set -uo/{/^set /!p;}' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (--kit DIR, --cpu)" >&2; exit 2 ;;
    *) RESULTS="$1"; shift ;;
  esac
done
START=$(date +%s)
BUDGET_S="${BUDGET_S:-540}"
REPEATS="${REPEATS:-1}" WARMUPS="${WARMUPS:-1}" KEEP="${KEEP:-0}"
if [ "$CPU" = 1 ]; then
  FAMILIES="${FAMILIES:-tiny}" DEVICE=cpu RUN_RESERVE_S="${RUN_RESERVE_S:-20}"
else
  FAMILIES="${FAMILIES:-ltxv-13b}" DEVICE=cuda RUN_RESERVE_S="${RUN_RESERVE_S:-150}"
fi
for family in $FAMILIES; do  # a typo is found now, not after the kit install and the GPU tests
  case "$family" in
    ltxv-13b | wan-14b | wan22-14b | tiny) ;;
    *) echo "unknown family $family in FAMILIES (ltxv-13b, wan-14b, wan22-14b, tiny)" >&2; exit 2 ;;
  esac
done
read -r -a BENCH_EXTRA <<<"${BENCH_ARGS:-}"
RESULTS="${RESULTS:-${TMPDIR:-/tmp}/leanvideo-proof-$(date -u +%Y%m%d-%H%M%S)}"
HANDBACK="${OUT:-$RESULTS/handback}"
mkdir -p "$RESULTS"
LOG="$RESULTS/log.txt"
exec 3>&1 4>&2
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
# the log so far into the hand-back: if the device call's own time limit stops this script, it is back
checkpoint() { mkdir -p "$HANDBACK" && cp "$LOG" "$HANDBACK/log.txt" 2>/dev/null || true; }
FAILED=()  # the steps that failed, said at the end and in the exit status

PY=.venv/bin/python
LEANVIDEO=(.venv/bin/leanvideo)
finish() {
  local status=$?  # an early exit's own code (2, 3, 4) is kept
  echo "== 3. hand back ($(left) s left): $HANDBACK"
  # said before the hand-back, so that the log handed back names the failed steps too
  [ ${#FAILED[@]} -eq 0 ] || echo "FAILED: ${FAILED[*]}"
  printf '%s\n' "${FAILED[@]}" | sed '/^$/d' >"$RESULTS/failed.txt"  # summary.json carries them too
  # the tee may still be writing the last lines: stop feeding it and let it end (2 s at most: a process
  # still holding the pipe would keep it open) before the log is handed back; later lines go to both
  exec 1>&3 2>&4
  for _ in $(seq 20); do kill -0 "$TEE_PID" 2>/dev/null || break; sleep 0.1; done
  exec > >(tee -a "$LOG") 2>&1
  if ! "$PY" -m benchmarks.proof_report "$RESULTS" --into "$HANDBACK" --families "$FAMILIES" --log "$LOG"; then
    echo "FAILED: proof_report (the hand-back above is incomplete)"
    FAILED+=("proof_report")
  fi
  echo "done in $(($(date +%s) - START)) s; everything in $RESULTS"
  [ "$status" -eq 0 ] || exit "$status"
  [ ${#FAILED[@]} -eq 0 ] || exit 1
}
trap finish EXIT

if [ -n "$KIT" ]; then
  PY="${PYTHON:-python3}"
  echo "== 0. device kit $KIT -> ${TMPDIR:-/tmp}/leanvideo-kit ($("$PY" -V), $(left) s left)"
  exports=$("$PY" -m benchmarks.device_kit install "$KIT" --into "${TMPDIR:-/tmp}/leanvideo-kit") || exit 3
  eval "$exports"
  export PYTHONPATH LEANVIDEO_COMFYUI LEANVIDEO_WORKSPACE
  LEANVIDEO=("$PY" -m runner.cli.main)
fi
KERNELS_SITE="${KERNELS_SITE:-$PWD/.device-kernels}"
if [ -f "$KERNELS_SITE/kernels.json" ] && [ -d "$KERNELS_SITE/site" ]; then
  export PYTHONPATH="$KERNELS_SITE/site${PYTHONPATH:+:$PYTHONPATH}"
  echo "comfy-kitchen: the kernel kit an earlier call installed in $KERNELS_SITE"
else
  echo "comfy-kitchen: not in $KERNELS_SITE (run benchmarks/gpu_kernel_table.sh --kernels KIT first)"
fi
"$PY" -c 'import torch, importlib.metadata as m
from leanvideo.int8.linear import import_kitchen
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
print("comfy-kitchen", m.version("comfy-kitchen") if import_kitchen() else "absent: the kitchen kernel is left out")'
if [ "$CPU" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "no CUDA device here (torch.cuda.is_available() is False): --cpu runs the CPU rehearsal" >&2
  exit 4
fi

if [ "$CPU" = 1 ]; then
  printf 'name\nnone (--cpu)\n' >"$RESULTS/gpu.csv"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$RESULTS/gpu.csv"
  df -h "${TMPDIR:-/tmp}" | tee "$RESULTS/disk.txt"
fi
if [ "${TESTS:-1}" = 1 ]; then
  echo "== 1. GPU tests: pytest -m gpu ($(left) s left; on a CPU they are skipped, the command still runs)"
  # -W default: a warning of torch, Triton or comfy-kitchen on this machine is reported, not a failure
  timeout 180 "$PY" -m pytest -q -m gpu -p no:cacheprovider -W default tests/test_int8_core.py \
    tests/test_int8_dispatch.py tests/test_runtime_attention.py >"$RESULTS/gpu_tests.txt" 2>&1
  status=$?
  tail -25 "$RESULTS/gpu_tests.txt"
  echo "pytest exited $status:$(tail -1 "$RESULTS/gpu_tests.txt" | tr -d '=')"
  [ "$status" -eq 0 ] || [ "$status" -eq 5 ] || FAILED+=("GPU tests (pytest exit $status)")
  checkpoint
fi
if [ "$CPU" = 1 ] || [ "${KERNELS:-1}" = 0 ]; then
  echo "== 1. INT8 linear layers: left out (--cpu or KERNELS=0)"
else
  echo "== 1. INT8 linear layers: W8A8 / W8A16 vs bf16 on the GPU ($(left) s left)"
  # Each kernel (w8a16, int_mm, int_mm_fused, kitchen when comfy-kitchen imports) and auto vs bf16.
  timeout 120 "$PY" benchmarks/int8_bench.py --skip-files --device cuda --tokens 4096 \
    --out "$RESULTS/int8_linear.json" --json "$RESULTS/int8_kernels.json" \
    >"$RESULTS/int8_linear.txt" 2>&1 || { echo "int8_bench failed or timed out"; FAILED+=("int8_bench"); }
  grep -A16 "^linear on" "$RESULTS/int8_linear.txt" || tail -5 "$RESULTS/int8_linear.txt"
fi

for family in $FAMILIES; do
  case "$family" in
    ltxv-13b) matrix=benchmarks/seed_table.toml ;;
    wan-14b) matrix=benchmarks/seed_table_wan.toml ;;
    wan22-14b) matrix=benchmarks/seed_table_wan22.toml ;;
    tiny) matrix=benchmarks/seed_table_tiny.toml ;;
  esac
  if [ "$(left)" -lt $((RUN_RESERVE_S + 30)) ]; then
    echo "== $family: skipped, $(left) s of the ${BUDGET_S} s budget left"
    FAILED+=("$family (no time left)")
    continue
  fi
  if [ "$family" != tiny ]; then
    echo "== 2. $family: synthetic full-size models on the GPU ($(left) s left)"
    if ! timeout "$(left)" "$PY" -m benchmarks.synth_models "$family" --device "$DEVICE" |
      tee "$RESULTS/synth-$family.txt"; then
      echo "== $family: writing its models failed (above); its matrix is not run"
      FAILED+=("synth_models $family")
      [ "$KEEP" = 1 ] || "$PY" -m benchmarks.synth_models "$family" --remove
      continue
    fi
  fi
  echo "== 2. $family: $matrix, $WARMUPS warmup + $REPEATS repeat(s) per variant ($(left) s left)"
  # --budget-s: no run starts after it (the report covers what ran); `timeout` is only the hard stop,
  # 30 s before the budget's end so that the hand-back still happens.
  status=0 runs_until=$(($(left) - RUN_RESERVE_S)) hard_stop=$(($(left) - 30))
  [ "$runs_until" -ge 10 ] || runs_until=10
  if [ "$hard_stop" -lt 10 ]; then  # `timeout 0` would mean no limit at all
    echo "== $family: its matrix is not run, $(left) s of the ${BUDGET_S} s budget left"
    FAILED+=("$family (no time left)")
    continue
  fi
  timeout "$hard_stop" "${LEANVIDEO[@]}" bench "$matrix" --out "$RESULTS/$family" \
    --repeats "$REPEATS" --warmups "$WARMUPS" --budget-s "$runs_until" "${BENCH_EXTRA[@]}" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "$family: bench exited $status (4: a server stopped answering; 6: a variant failed; 7: nothing measured in the budget; 124: stopped at the hard limit)"
    FAILED+=("bench $family (exit $status)")
  fi
  if [ "$family" != tiny ] && [ "$KEEP" != 1 ]; then
    "$PY" -m benchmarks.synth_models "$family" --remove
  fi
  checkpoint
done
