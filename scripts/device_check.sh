#!/usr/bin/env bash
# GPU validation pack (issues 7, 48). One command; everything lands in one folder.
#   scripts/device_check.sh OUT_DIR      (or OUT=OUT_DIR scripts/device_check.sh)
# DEADLINE (seconds, default 420): no part or trainer run starts after it, so the whole pack ends inside a lease;
# JOBS (default 4): the memory parts run side by side and this many trainer runs of a part at once.
# On a machine with no network, Python packages the image lacks travel as wheels in .whl/ (the device
# README's recipe): they are installed into a folder of their own first. On a CPU machine it runs tiny sizes
# and reports the GPU-only parts as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-device-check}}
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpudash-site \
    .whl/*.whl
  export PYTHONPATH=/tmp/gpudash-site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/gpudash-site/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
DEADLINE=${DEADLINE:-420}
mkdir -p "$OUT_DIR"
timeout $((DEADLINE + 90)) "$PY" scripts/device_check.py "$OUT_DIR" --deadline "$DEADLINE" --jobs "${JOBS:-4}" \
  "${@:2}" 2>&1 | tee "$OUT_DIR/device_check.log" || true
# issue 28: QLoRA / 8-bit optimizer bytes against the estimator (skips itself without CUDA or bitsandbytes)
timeout 60 "$PY" scripts/device_check_finetune.py "$OUT_DIR" 2>&1 | tee "$OUT_DIR/device_check_finetune.log" || true
