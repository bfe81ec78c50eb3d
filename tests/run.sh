#!/usr/bin/env bash
# The one test command: installs runtime + test extras into .venv, then runs the suite.
#   bash tests/run.sh                 whole suite
#   bash tests/run.sh tests/test_x.py -k name   any pytest arguments
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/launch/setup_env.sh" --test)"
cd "$root"
exec "$py" -m pytest -q -rs --durations=15 "${@:-tests}"
