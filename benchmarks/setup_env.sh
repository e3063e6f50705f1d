#!/usr/bin/env bash
# The benchmarks' own environment: gpudash plus the peers it is compared with
# (wandb, trackio, TensorBoard with tensorboardX as the writer; crc32c is
# tensorboardX's native checksum, without it writing a long run takes minutes),
# which are not gpudash dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_VENV=${BENCH_VENV:-.venv-bench}
[ -x "$BENCH_VENV/bin/python" ] || python3 -m venv "$BENCH_VENV"
PIP=("$BENCH_VENV/bin/python" -m pip install --disable-pip-version-check -q)
"$BENCH_VENV/bin/python" -c 'import torch' 2>/dev/null || "${PIP[@]}" 'torch==2.13.0+cpu' 2>/dev/null \
  || "${PIP[@]}" torch --index-url https://download.pytorch.org/whl/cpu
"${PIP[@]}" -e '.[train]' wandb trackio tensorboard tensorboardX crc32c
echo "$BENCH_VENV ready"
