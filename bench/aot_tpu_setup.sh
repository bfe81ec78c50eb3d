#!/usr/bin/env bash
# Creates .venv-tpu at the repo root for bench/aot_tpu.py: jax[tpu] (jax + libtpu, which compiles
# TPU programs ahead of time on a CPU host) plus the pinned stack's runtime requirements (requirements-pinned.txt) without the
# CPU jax/jaxlib pins, and the project itself (editable, no deps).
set -euo pipefail
cd "$(dirname "$0")/.."
python3.11 -m venv .venv-tpu
.venv-tpu/bin/pip install -q --upgrade pip
grep -vE '^(jax|jaxlib)==' requirements-pinned.txt > .venv-tpu/requirements-nojax.txt
.venv-tpu/bin/pip install -q -r .venv-tpu/requirements-nojax.txt -r bench/requirements-tpu.txt
.venv-tpu/bin/pip install -q -e . --no-deps
.venv-tpu/bin/python -c "import jax, libtpu; print('jax', jax.__version__, 'libtpu', libtpu.__version__)"
