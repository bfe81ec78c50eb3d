#!/usr/bin/env bash
# Creates or refreshes a side virtualenv for a check whose packages cannot share .venv, and prints its python.
#   bash launch/setup_side_env.sh openenv   OpenEnv (openenv-core pulls gradio, which downgrades pillow and
#                                           tomlkit): tests/envpack/test_envpack.py checks environment packs with it
#   bash launch/setup_side_env.sh litellm   litellm (boto3 needs python-dateutil<3): tests/serve/test_serve.py checks
#                                           that litellm reads the server's errors and forced tool calls
# Each installs requirements-test-NAME.txt into SPADE_SIDE_VENVS/NAME (default build/venv-NAME, an ignored
# path). PYTHON picks the interpreter (default python3.12, else the one .venv was made with). Re-running is
# cheap: packages are installed again only when the requirements file changes. Under CI the tests make them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
  -h | --help | "") sed -n 2,9p "${BASH_SOURCE[0]}" | cut -c3-; [[ -n "${1:-}" ]]; exit ;;
  openenv | litellm) name="$1" ;;
  *) echo "setup_side_env.sh: unknown side venv '$1' (openenv or litellm)" >&2; exit 2 ;;
esac
venv="${SPADE_SIDE_VENVS:-$root/build}/venv-$name"
python="${PYTHON:-python3.12}"
if [[ -z "${PYTHON:-}" ]] && ! python3.12 -c '' 2>/dev/null; then
  python="$root/.venv/bin/python"  # made by launch/setup_env.sh on Python 3.12; venv takes its base interpreter
fi
requirements="$root/requirements-test-$name.txt"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[setup] creating $venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi
want="$(sha256sum < "$requirements" | cut -c1-16)"
if [[ "$(cat "$venv/.spade_side_env" 2>/dev/null)" != "$want" ]]; then
  echo "[setup] installing $requirements" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" >&2
  echo "$want" > "$venv/.spade_side_env"
fi
echo "$venv/bin/python"
