#!/usr/bin/env bash
# Runs the job on NVIDIA GPUs: one node, several nodes with explicit ranks, or under SLURM.
#
#   bash launch/gpu.sh -- --config=configs/qwen3_0p6b.py --workdir=runs/q --config.model.path=/models/Qwen3-0.6B
#   bash launch/gpu.sh --nodes=2 --node_rank=0 --coordinator=10.0.0.1:4321 -- --config=...   # on each node
#   srun --nodes=4 --ntasks-per-node=1 bash launch/gpu.sh --slurm -- --config=...
#   [--dry-run] prints the commands instead of running them.
#
# Installs jax[cuda13] into .venv on first use (set SPADE_JAX_EXTRA to pick another extra).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nodes=1 node_rank=0 coordinator="" slurm=0 dry=0
while (($#)); do
  case "$1" in
    --nodes=*) nodes="${1#*=}" ;;
    --node_rank=*) node_rank="${1#*=}" ;;
    --coordinator=*) coordinator="${1#*=}" ;;
    --slurm) slurm=1 ;;
    --dry-run) dry=1 ;;
    --) shift; break ;;
    *) echo "gpu.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
  esac
  shift
done
if ((nodes > 1)) && [[ -z "$coordinator" ]]; then
  echo "gpu.sh: --nodes > 1 needs --coordinator=HOST:PORT (node 0's address)" >&2; exit 2
fi

run() {
  if ((dry)); then printf '%q ' "$@"; echo; else "$@"; fi
}

extra="${SPADE_JAX_EXTRA:-cuda13}"
if ((dry)); then
  py="$root/.venv/bin/python"
  echo "bash $root/launch/setup_env.sh && $py -m pip install 'jax[$extra]==0.10.2'"
else
  py="$(bash "$root/launch/setup_env.sh")"
  "$py" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null \
    || "$py" -m pip install -q "jax[$extra]==0.10.2"
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
