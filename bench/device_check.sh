#!/usr/bin/env bash
# The accelerator check (bench/device_check.py): one markdown table in $OUT (or --out=FILE),
# under 8 minutes on one H200. Installs nothing from the network: with --wheels=DIR it
# installs DIR's wheels without dependencies (e.g. ml-collections for the tiny run).
#
#   bash bench/device_check.sh                      # on the GPU machine
#   bash bench/device_check.sh --wheels=shared/wheels --out=/tmp/device_check.md
#   bash bench/device_check.sh --dry-run --out=/tmp/dry.md   # on CPU, toy shapes, about a minute
set -uo pipefail
cd "$(dirname "$0")/.."

args=()
for arg in "$@"; do
  case "$arg" in
    --wheels=*) wheels="${arg#--wheels=}" ;;
    *) args+=("$arg") ;;
  esac
done
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
if [ -n "${wheels:-}" ]; then
  "$python" -m pip install --no-deps --no-index --quiet "$wheels"/*.whl || echo "device_check: wheels from $wheels not installed" >&2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# 470 s: whatever runs past it is cut; the table written after the last finished job stays.
exec timeout --kill-after=10 470 "$python" bench/device_check.py "${args[@]}"
