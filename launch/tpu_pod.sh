#!/usr/bin/env bash
# Creates (or reuses) a Cloud TPU VM slice, copies this checkout to every worker, installs,
# optionally copies model weights from a bucket to each worker's disk, and starts the job
# on all workers at once. Options and examples: bash launch/tpu_pod.sh --help
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'USAGE'
usage: bash launch/tpu_pod.sh --name NAME --zone ZONE --accelerator TYPE [options] [-- spade_jax.main flags]

Creates (or reuses) a Cloud TPU VM slice with gcloud, copies this checkout to every worker,
installs it there (.venv with jax[tpu] at the stack's jax version), optionally copies model weights from a bucket to
each worker's disk, and starts `python -m spade_jax.main` on all workers at once
(jax.distributed finds its peers: SPADE_DISTRIBUTED=auto). Each worker logs to
~/spade_job.log.

options (--opt=value or --opt value):
  --name NAME            the TPU VM's name (required)
  --zone ZONE            its zone, e.g. us-central2-b (required)
  --accelerator TYPE     its accelerator type, e.g. v4-32 (required)
  --version V            the TPU VM software version (default tpu-ubuntu2204-base)
  --project P            the gcloud project (default: gcloud's configured project)
  --spot                 create a Spot VM
  --stack S              latest (requirements.txt, jax 0.12, python3.12) or pinned
                         (requirements-pinned.txt, jax 0.10.2, python3.11) (default latest);
                         a worker without that python and its venv module gets them from
                         apt (the deadsnakes PPA: Ubuntu 22.04 images ship 3.10)
  --model_bucket URL     copied to ~/model on every worker and passed as
                         --config.model.path (default none)
  --workdir DIR          the job's --workdir (default ~/spade_runs/<name> on the workers'
                         local disks; relative paths are taken from ~/spade_jax, where the
                         job runs)
  --dry-run              print every command instead of running it
  -h, --help             print this help and exit

Everything after `--` goes to `python -m spade_jax.main` on every worker unchanged (absl
flags such as --config=..., --config.x=...); any other option before `--` is refused.

example:
  bash launch/tpu_pod.sh --name spade-v4 --zone us-central2-b --accelerator v4-32 \
      --model_bucket gs://bucket/Qwen3-4B -- --config=configs/qwen3_4b.py
USAGE
}

name="" zone="" accelerator="" version="tpu-ubuntu2204-base" project="" spot=0 dry=0
model_bucket="" workdir="" stack=latest
source "$(dirname "${BASH_SOURCE[0]}")/options.sh"
while (($#)); do
  OPT_SHIFT=1
  case "$1" in
    --name | --name=*) option_value tpu_pod.sh "$@"; name="$OPT_VALUE" ;;
    --zone | --zone=*) option_value tpu_pod.sh "$@"; zone="$OPT_VALUE" ;;
    --accelerator | --accelerator=*) option_value tpu_pod.sh "$@"; accelerator="$OPT_VALUE" ;;
    --version | --version=*) option_value tpu_pod.sh "$@"; version="$OPT_VALUE" ;;
    --project | --project=*) option_value tpu_pod.sh "$@"; project="$OPT_VALUE" ;;
    --model_bucket | --model_bucket=*) option_value tpu_pod.sh "$@"; model_bucket="$OPT_VALUE" ;;
    --workdir | --workdir=*) option_value tpu_pod.sh "$@"; workdir="$OPT_VALUE" ;;
    --stack | --stack=*) option_value tpu_pod.sh "$@"; stack="$OPT_VALUE" ;;
    --spot) spot=1 ;;
    --dry-run) dry=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "tpu_pod.sh: unknown option $1 (see --help; flags for spade_jax.main go after --)" >&2; exit 2 ;;
  esac
  shift "$OPT_SHIFT"
done
[[ -n "$name" && -n "$zone" && -n "$accelerator" ]] || {
  echo "tpu_pod.sh: --name, --zone and --accelerator are required (see --help)" >&2; exit 2; }
case "$stack" in
  pinned) suffix="-pinned" worker_python=python3.11 ;;
  latest) suffix="" worker_python=python3.12 ;;
  *) echo "tpu_pod.sh: --stack must be pinned or latest (got $stack)" >&2; exit 2 ;;
esac
jax_version="$(sed -n 's/^jax==//p' "$root/requirements$suffix.txt")"
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
run tar -czf "$bundle" -C "$root" --exclude='.venv*' --exclude=.git --exclude='workdir*' .
run "${gc[@]}" scp "$bundle" "$name:~/spade_jax.tar.gz" "${scope[@]}" --worker=all

setup='set -e; mkdir -p ~/spade_jax && tar -xzf ~/spade_jax.tar.gz -C ~/spade_jax && cd ~/spade_jax'
setup+=" && { $worker_python -c 'import ensurepip' 2>/dev/null || { sudo add-apt-repository -y ppa:deadsnakes/ppa"
setup+=" && sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $worker_python-venv; }; }"
setup+=" && $worker_python -m venv .venv && .venv/bin/pip install -q -U pip"
setup+=" && .venv/bin/pip install -q -r requirements$suffix.txt 'jax[tpu]==$jax_version'"
setup+=" && .venv/bin/pip install -q --no-deps -r requirements-nodeps$suffix.txt && .venv/bin/pip install -q --no-deps -e ."
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
