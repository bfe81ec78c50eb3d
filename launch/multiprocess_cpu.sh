#!/usr/bin/env bash
# Runs the job as N JAX processes on this machine (jax.distributed, gloo CPU collectives).
# Each process gets SPADE_DEVICES_PER_PROCESS fake CPU devices (default 1) and its own
# sandbox workers; process 0 prints to the terminal, the others log to
# ${SPADE_LOG_DIR:-/tmp}/spade_process_<i>.log.
#   bash launch/multiprocess_cpu.sh 2 --config=configs/tiny.py:runlocal --workdir=/tmp/mp
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
num="${1:?usage: multiprocess_cpu.sh NUM_PROCESSES [spade_jax.main flags]}"
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
