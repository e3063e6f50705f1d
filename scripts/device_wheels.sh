#!/usr/bin/env bash
# Wheels for a GPU machine with no network whose image has torch but not the dashboard's packages (the lent
# H200: Python 3.12, x86-64). Run here, where pip reaches an index; then carry .whl/ to the device (it must be
# ignored by git: `echo /.whl/ >> .git/info/exclude`), where scripts/device_check.sh installs them first.
#   scripts/device_wheels.sh [PYTHON_VERSION]      (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
TMP=$(mktemp -d)
python3 -m pip download -q --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  -d "$TMP" dash plotly flask-compress tsdownsample py-spy
mkdir -p .whl
# only what that image lacks (numpy, jinja2, requests, click, packaging... are there: a second copy would shadow
# torch's own)
for n in dash plotly flask flask_compress tsdownsample py_spy blinker itsdangerous retrying nest_asyncio janus \
         lazy_importer comm brotli backports_zstd importlib_metadata pydantic- pydantic_core annotated_types \
         typing_inspection typing_extensions werkzeug; do
  cp "$TMP"/"${n}"*.whl .whl/ 2>/dev/null || echo "device_wheels: no wheel for $n (a newer dash may not need it)"
done
rm -rf "$TMP"
du -sh .whl
