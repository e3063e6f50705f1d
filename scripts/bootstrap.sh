#!/usr/bin/env bash
# Create (or update) the project's virtual environment.
# - reuses a torch the system Python already has (venv with system site-packages)
# - on a machine without an NVIDIA GPU installs the CPU build of torch, never the
#   multi-gigabyte CUDA one
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "gpudash needs Python >= 3.10 (found $("$PYTHON" --version)); set PYTHON=python3.x" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "bootstrap: reusing the system's torch ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "bootstrap: NVIDIA GPU found, installing torch (CUDA build)"
    "${PIP[@]}" torch
  else
    echo "bootstrap: no GPU, installing the CPU build of torch"
    "${PIP[@]}" 'torch==2.13.0+cpu' 2>/dev/null \
      || "${PIP[@]}" torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi

EXTRAS=${GPUDASH_EXTRAS:-train,dev,hf,lightning,s3}
echo "bootstrap: installing gpudash[$EXTRAS] (editable)"
"${PIP[@]}" -e ".[${EXTRAS}]"
