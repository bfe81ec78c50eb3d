#!/usr/bin/env bash
# The README's main command: creates .venv on first use, then runs spade_jax.main.
# Options and examples: bash launch/run_local.sh --help
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'USAGE'
usage: bash launch/run_local.sh [spade_jax.main flags]

The README's main command: creates or refreshes .venv (launch/setup_env.sh), then runs
`python -m spade_jax.main` on this machine. A second call with the same workdir resumes
that run.

Every flag goes to `python -m spade_jax.main` unchanged (absl flags such as
--config=configs/tiny.py, --workdir=DIR, --config.x=...; `bash launch/run_local.sh --helpfull`
lists them). Defaults: --config=configs/tiny.py (spade_jax.main's default) and
--workdir=workdirs/tiny (added unless a --workdir is given, as --workdir=DIR or --workdir DIR).

options:
  -h, --help    print this help and exit

example:
  bash launch/run_local.sh --config=configs/tiny.py:runlocal --workdir /tmp/tiny
USAGE
}

for arg in "$@"; do
  case "$arg" in -h | --help) usage; exit 0 ;; esac
done
py="$(bash "$root/launch/setup_env.sh")"
cd "$root"
args=("$@")
case " $* " in
  *" --workdir="* | *" --workdir "*) ;;
  *) args+=("--workdir=workdirs/tiny") ;;
esac
exec "$py" -m spade_jax.main "${args[@]}"
