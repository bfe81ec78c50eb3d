#!/usr/bin/env bash
# Runs the job on NVIDIA GPUs: one node, several nodes with explicit ranks, or under SLURM.
# Options and examples: bash launch/gpu.sh --help
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'USAGE'
usage: bash launch/gpu.sh [options] [-- spade_jax.main flags]

Runs `python -m spade_jax.main` on NVIDIA GPUs: on one node, on several nodes with explicit
ranks (run it on each node), or under SLURM. Installs jax[cuda13] at the stack's jax version
into its venv on first use (set SPADE_JAX_EXTRA to pick another extra).

options (--opt=value or --opt value):
  --nodes N            number of nodes (default 1)
  --node_rank R        this node's rank, 0..N-1 (default 0)
  --coordinator H:P    node 0's address; required when --nodes > 1 (default none)
  --slurm              take nodes and ranks from SLURM (SPADE_DISTRIBUTED=auto)
  --stack S            latest (jax 0.12, Python 3.12, .venv) or pinned (jax 0.10.2,
                       .venv-pinned); see launch/setup_env.sh --help (default latest)
  --dry-run            print the commands instead of running them
  -h, --help           print this help and exit

Everything after `--` goes to `python -m spade_jax.main` unchanged (absl flags such as
--config=..., --workdir=..., --config.x=...); any other option before `--` is refused.

examples:
  bash launch/gpu.sh -- --config=configs/qwen3_0p6b.py --workdir=runs/q --config.model.path=/models/Qwen3-0.6B
  bash launch/gpu.sh --nodes 2 --node_rank 0 --coordinator 10.0.0.1:4321 -- --config=...   # on each node
  srun --nodes=4 --ntasks-per-node=1 bash launch/gpu.sh --slurm -- --config=...
USAGE
}

nodes=1 node_rank=0 coordinator="" slurm=0 dry=0 stack=latest
source "$(dirname "${BASH_SOURCE[0]}")/options.sh"
while (($#)); do
  OPT_SHIFT=1
  case "$1" in
    --nodes | --nodes=*) option_value gpu.sh "$@"; nodes="$OPT_VALUE" ;;
    --node_rank | --node_rank=*) option_value gpu.sh "$@"; node_rank="$OPT_VALUE" ;;
    --coordinator | --coordinator=*) option_value gpu.sh "$@"; coordinator="$OPT_VALUE" ;;
    --stack | --stack=*) option_value gpu.sh "$@"; stack="$OPT_VALUE" ;;
    --slurm) slurm=1 ;;
    --dry-run) dry=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "gpu.sh: unknown option $1 (see --help; flags for spade_jax.main go after --)" >&2; exit 2 ;;
  esac
  shift "$OPT_SHIFT"
done
if ((nodes > 1)) && [[ -z "$coordinator" ]]; then
  echo "gpu.sh: --nodes > 1 needs --coordinator=HOST:PORT (node 0's address)" >&2; exit 2
fi

run() {
  if ((dry)); then printf '%q ' "$@"; echo; else "$@"; fi
}

case "$stack" in
  pinned) suffix="-pinned" ;;
  latest) suffix="" ;;
  *) echo "gpu.sh: --stack must be pinned or latest (got $stack)" >&2; exit 2 ;;
esac
jax_version="$(sed -n 's/^jax==//p' "$root/requirements$suffix.txt")"
extra="${SPADE_JAX_EXTRA:-cuda13}"
if ((dry)); then
  py="$root/.venv$suffix/bin/python"
  echo "bash $root/launch/setup_env.sh --stack=$stack && $py -m pip install 'jax[$extra]==$jax_version'"
else
  py="$(bash "$root/launch/setup_env.sh" --stack="$stack")"
  "$py" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null \
    || "$py" -m pip install -q "jax[$extra]==$jax_version"
fi

cd "$root"
if ((slurm)); then
  run env SPADE_DISTRIBUTED=auto "$py" -m spade_jax.main "$@"
elif ((nodes > 1)); then
  run env SPADE_COORDINATOR="$coordinator" SPADE_NUM_PROCESSES="$nodes" SPADE_PROCESS_ID="$node_rank" \
    "$py" -m spade_jax.main "$@"
else
  run "$py" -m spade_jax.main "$@"
fi
