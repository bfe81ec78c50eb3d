#!/usr/bin/env bash
# Creates or refreshes the virtualenv that checks environment packs against OpenEnv, and prints its python.
#   bash launch/setup_openenv_env.sh
# openenv-core 0.3.0 pulls gradio, which downgrades pillow and tomlkit: it cannot share .venv, so it
# lives in its own venv (requirements-test-openenv.txt; SPADE_OPENENV_VENV, default build/venv-openenv,
# an ignored path). tests/test_envpack_openenv.py runs its check there when that python exists.
# PYTHON picks the interpreter (default python3.12, else the one .venv was made with). Re-running is cheap: packages are installed
# again only when the requirements file changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in -h | --help) sed -n 2,8p "${BASH_SOURCE[0]}" | cut -c3-; exit 0 ;; esac
venv="${SPADE_OPENENV_VENV:-$root/build/venv-openenv}"
python="${PYTHON:-python3.12}"
if [[ -z "${PYTHON:-}" ]] && ! python3.12 -c '' 2>/dev/null; then
  python="$root/.venv/bin/python"  # made by launch/setup_env.sh on Python 3.12; venv takes its base interpreter
fi
requirements="$root/requirements-test-openenv.txt"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi
want="$(sha256sum < "$requirements" | cut -c1-16)"
if [[ "$(cat "$venv/.spade_openenv" 2>/dev/null)" != "$want" ]]; then
  echo "[setup] installing $requirements" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" >&2
  echo "$want" > "$venv/.spade_openenv"
fi
echo "$venv/bin/python"
