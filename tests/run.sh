#!/usr/bin/env bash
# The one test command: installs runtime + test extras into .venv (the default stack, the newest
# JAX on Python 3.12), then runs the suite.
#   bash tests/run.sh                 whole suite: SPADE_TEST_WORKERS processes (default 2) share the
#                                     tests, then the `serial` ones (wall-clock and resource bounds) run alone
#   bash tests/run.sh tests/rl/test_x.py -k name   any pytest arguments, one process
#   bash tests/run.sh --stack=pinned [pytest arguments]   on the compatibility stack (jax 0.10.2,
#                                     .venv-pinned; launch/setup_env.sh --help): the compatibility
#                                     subset (COMPAT below), or the given arguments; .ci/run runs
#                                     the subset after the suite
# Every process of the run, test subprocesses included, shares one JAX compilation cache (a fresh
# temporary directory, removed at the end; set JAX_COMPILATION_CACHE_DIR to keep one across runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Model parity, sampler, rollout engine, update, sharding, losses, one self-play iteration, the
# persistent compilation cache, gymnax (installed --no-deps past its jax<0.12) and the paged cache
# with its Pallas kernel interpreted through JAX internals (tests/sampling/pallas_interpret_shim.py):
# what another JAX release is most likely to break, in about 10 minutes on 2 cores.
COMPAT=(tests/models/test_model_parity.py tests/sampling/test_sampling.py tests/sampling/test_rollout_engine.py
        tests/rl/test_train.py tests/models/test_model_sharding.py tests/rl/test_advantages.py tests/rl/test_losses.py
        tests/selfplay/test_selfplay.py::test_one_iteration_end_to_end_on_a_tiny_random_model
        tests/test_compile_cache.py::test_a_second_process_loads_every_program_the_first_compiled
        tests/evals/test_evals_games.py tests/sampling/test_paged_cache.py)
stack=latest
case "${1:-}" in
  --stack=*) stack="${1#--stack=}"; shift ;;
  --stack) stack="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
esac
py="$(bash "$root/launch/setup_env.sh" --test --stack="$stack")"
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
if [[ "$stack" == pinned ]]; then
  "$py" -m pytest -q -rs --durations=15 -n "${SPADE_TEST_WORKERS:-2}" "${COMPAT[@]}"
  exit
fi
status=0
"$py" -m pytest -q -rs --durations=15 -n "${SPADE_TEST_WORKERS:-2}" -m "not serial" tests || status=$?
"$py" -m pytest -q -rs --durations=5 -m serial tests || status=$?
exit "$status"
