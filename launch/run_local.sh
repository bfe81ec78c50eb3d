#!/usr/bin/env bash
# The README's main command: creates .venv on first use, then runs spade_jax.main.
#   bash launch/run_local.sh [absl flags ...]
# Defaults: --config=configs/tiny.py (spade_jax.main's default) and --workdir=workdirs/tiny;
# a second call with the same workdir resumes that run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/launch/setup_env.sh")"
cd "$root"
args=("$@")
case " $* " in
  *" --workdir="* | *" --workdir "*) ;;
  *) args+=("--workdir=workdirs/tiny") ;;
esac
exec "$py" -m spade_jax.main "${args[@]}"
