#!/usr/bin/env bash
# The README's main command: creates .venv on first use, then runs spade_jax.main.
#   bash launch/run_local.sh [absl flags ...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/launch/setup_env.sh")"
cd "$root"
exec "$py" -m spade_jax.main "$@"
