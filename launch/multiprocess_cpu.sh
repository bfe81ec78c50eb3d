#!/usr/bin/env bash
# Runs the job as N JAX processes on this machine (jax.distributed, gloo CPU collectives).
# Options and examples: bash launch/multiprocess_cpu.sh --help
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'USAGE'
usage: bash launch/multiprocess_cpu.sh NUM_PROCESSES [spade_jax.main flags]

Runs `python -m spade_jax.main` as NUM_PROCESSES JAX processes on this machine
(jax.distributed, gloo CPU collectives), each with its own fake CPU devices and its own
sandbox workers. Process 0 prints to the terminal; process i > 0 logs to
$SPADE_LOG_DIR/spade_process_<i>.log. Creates .venv on first use (launch/setup_env.sh).

NUM_PROCESSES (a positive integer) is its only argument; every flag after it goes to
`python -m spade_jax.main` in every process unchanged (absl flags such as --config=...,
--workdir=..., --config.x=...; `.venv/bin/python -m spade_jax.main --helpfull` lists them).

options:
  -h, --help                   print this help and exit

environment:
  SPADE_DEVICES_PER_PROCESS    fake CPU devices per process (default 1)
  SPADE_LOG_DIR                where processes 1.. log (default /tmp)
  SPADE_PYTHON                 the python to run (default: .venv's, made by launch/setup_env.sh)

example:
  bash launch/multiprocess_cpu.sh 2 --config=configs/tiny.py:runlocal --workdir=/tmp/mp
USAGE
}

for arg in "$@"; do
  case "$arg" in -h | --help) usage; exit 0 ;; esac
done
num="${1:-}"
if [[ ! "$num" =~ ^[1-9][0-9]*$ ]]; then
  echo "multiprocess_cpu.sh: the first argument must be NUM_PROCESSES, a positive integer (got '$num'; see --help)" >&2
  exit 2
fi
shift
py="${SPADE_PYTHON:-$(bash "$root/launch/setup_env.sh")}"
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
logdir="${SPADE_LOG_DIR:-/tmp}"
devices="${SPADE_DEVICES_PER_PROCESS:-1}"
pids=()
cd "$root"
for ((i = 0; i < num; i++)); do
  env_vars=(SPADE_COORDINATOR="127.0.0.1:$port" SPADE_NUM_PROCESSES="$num" SPADE_PROCESS_ID="$i"
            JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=$devices")
  if ((i == 0)); then
    env "${env_vars[@]}" "$py" -m spade_jax.main "$@" &
  else
    env "${env_vars[@]}" "$py" -m spade_jax.main "$@" > "$logdir/spade_process_$i.log" 2>&1 &
  fi
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=$?
done
exit "$status"
