#!/usr/bin/env bash
# GPU validation pack (issue 7). One command; everything lands in one folder.
#   scripts/device_check.sh OUT_DIR      (or OUT=OUT_DIR scripts/device_check.sh)
# Must finish in < 8 minutes on an H200; on a CPU machine it runs tiny sizes
# and reports the GPU-only parts as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-device-check}}
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$OUT_DIR"
timeout 470 "$PY" scripts/device_check.py "$OUT_DIR" "${@:2}" 2>&1 | tee "$OUT_DIR/device_check.log"
# issue 28: QLoRA / 8-bit optimizer bytes against the estimator (skips itself without CUDA or bitsandbytes)
timeout 150 "$PY" scripts/device_check_finetune.py "$OUT_DIR" 2>&1 | tee "$OUT_DIR/device_check_finetune.log" || true
