#!/usr/bin/env bash
# The one test command: installs runtime + test extras into .venv, then runs the suite.
#   bash tests/run.sh                 whole suite: SPADE_TEST_WORKERS processes (default 2) share the
#                                     tests, then the `serial` ones (wall-clock and resource bounds) run alone
#   bash tests/run.sh tests/test_x.py -k name   any pytest arguments, one process
# Every process of the run, test subprocesses included, shares one JAX compilation cache (a fresh
# temporary directory, removed at the end; set JAX_COMPILATION_CACHE_DIR to keep one across runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/launch/setup_env.sh" --test)"
cd "$root"
if [[ -z "${JAX_COMPILATION_CACHE_DIR:-}" ]]; then
  JAX_COMPILATION_CACHE_DIR="$(mktemp -d -t spade-jax-cache.XXXXXX)"
  trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
fi
export JAX_COMPILATION_CACHE_DIR JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
if (($#)); then
  "$py" -m pytest -q -rs --durations=15 "$@"
  exit
fi
status=0
"$py" -m pytest -q -rs --durations=15 -n "${SPADE_TEST_WORKERS:-2}" -m "not serial" tests || status=$?
"$py" -m pytest -q -rs --durations=5 -m serial tests || status=$?
exit "$status"
