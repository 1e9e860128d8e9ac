#!/usr/bin/env bash
# A one-machine Ray cluster to try `--address` with, and a stop that ends only it.
#
#   examples/local_cluster.sh start [DIR] [PORT] [CPUS]   # prints the address to join
#   raymvc run scenarios/hw-cefmc.yaml --address 127.0.0.1:PORT
#   examples/local_cluster.sh stop [DIR]
#
# `start` runs `ray start --head --block` in the background with its session files in
# DIR/ray (default: /tmp/raymvc-cluster-UID; Ray's socket paths under it must stay short,
# so DIR has at most 40 characters), no dashboard and no token
# authentication, and keeps its process id in DIR/pid. `stop` ends that one process,
# which stops the processes it started, and removes DIR: nothing else on the machine is
# touched (unlike `ray stop`, which stops every Ray instance of the user).
set -euo pipefail
cmd=${1:?usage: examples/local_cluster.sh start|stop [DIR] [PORT] [CPUS]}
dir=$(realpath -m "${2:-/tmp/raymvc-cluster-$(id -u)}")
port=${3:-6379}
cpus=${4:-2}
case "$cmd" in
start)
  if [ ${#dir} -gt 40 ]; then
    echo "DIR $dir: at most 40 characters (Ray's socket paths under it are limited); e.g. /tmp/rc" >&2; exit 2
  fi
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    echo "a cluster started from $dir is running (pid $(cat "$dir/pid"))" >&2; exit 1
  fi
  mkdir -p "$dir/ray"
  RAY_AUTH_MODE=disabled nohup ray start --head --block --port="$port" --num-cpus="$cpus" \
    --include-dashboard=false --temp-dir="$dir/ray" >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 1 120); do  # ready once the head's session answers
    if RAY_AUTH_MODE=disabled ray status --address "127.0.0.1:$port" >/dev/null 2>&1; then
      echo "127.0.0.1:$port"; exit 0
    fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/log" >&2; exit 1; }
    sleep 1
  done
  echo "the cluster did not answer within 120 s; see $dir/log" >&2; exit 1 ;;
stop)
  [ -f "$dir/pid" ] || { echo "no cluster started from $dir" >&2; exit 1; }
  pid=$(cat "$dir/pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then echo "pid $pid still runs; not removing $dir" >&2; exit 1; fi
  rm -rf "$dir" ;;
*) echo "usage: examples/local_cluster.sh start|stop [DIR] [PORT] [CPUS]" >&2; exit 2 ;;
esac
