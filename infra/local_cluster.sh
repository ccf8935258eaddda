#!/usr/bin/env bash
# A local Ray head of this project's own, for `ray job submit` (make cluster / make cluster-stop).
#   start: starts the head with the project's .venv first on its PATH, so a submitted `python jobs/...` runs in
#          .venv whatever the submitting shell's PATH is; prints the lines to paste and how to stop it.
#   stop:  stops this head alone: its processes are the ones whose command line names its own temp dir, so
#          another Ray on the machine (another project's, a test's private cluster) survives. `ray stop` would
#          stop every Ray on the machine.
# Settings (environment): RAY_PORT (6379), RAY_DASHBOARD_PORT (8265), RAY_NUM_CPUS (cores + 2: Ray Data's read
# tasks need logical CPUs beside the training workers on a small machine), RAY_CLIENT_PORT (10001),
# RAY_AGENT_PORT (52365), RAY_TEMP_DIR (/tmp/augssl-ray-<port>).
set -euo pipefail
cd "$(dirname "$0")/.."
venv_bin="$PWD/.venv/bin"
port=${RAY_PORT:-6379}
dash=${RAY_DASHBOARD_PORT:-8265}
temp=${RAY_TEMP_DIR:-/tmp/augssl-ray-$port}

client=${RAY_CLIENT_PORT:-10001}   # below Ray's worker port range (10002-19999)
agent=${RAY_AGENT_PORT:-52365}     # the dashboard agent's HTTP port: a second head needs its own

# This head's processes: those naming its temp dir, its Ray Client server (named by the head's port), and all
# their descendants (dashboard modules, agents, workers carry neither in their command lines).
tree() { local p; for p in "$@"; do echo "$p"; tree $(pgrep -P "$p" || true); done; }
pids() {
  tree $(pgrep -f -- "$temp" || true) $(pgrep -f -- "ray.util.client.server --address=[^ ]*:$port " || true) | sort -u
}

case "${1:-}" in
  start)
    [ -x "$venv_bin/ray" ] || { echo "error: $venv_bin/ray not found: run make venv first" >&2; exit 2; }
    if [ -n "$(pids)" ]; then
      echo "error: a head is already running from $temp (make cluster-stop stops it)" >&2; exit 2
    fi
    export RAY_AUTH_MODE=token
    "$venv_bin/ray" get-auth-token --generate >/dev/null
    cpus=${RAY_NUM_CPUS:-$(( $(nproc) + 2 ))}
    PATH="$venv_bin:$PATH" "$venv_bin/ray" start --head --port "$port" --dashboard-host 127.0.0.1 --dashboard-port "$dash" \
      --ray-client-server-port "$client" --dashboard-agent-listen-port "$agent" --num-cpus "$cpus" --temp-dir "$temp" --disable-usage-stats >"$temp.log" 2>&1 \
      || { echo "error: ray start failed; its output is in $temp.log" >&2; tail -5 "$temp.log" >&2; exit 1; }
    cat <<EOF
Ray head started ($cpus CPUs; jobs run with $venv_bin/python). Paste into your shell:
export RAY_ADDRESS=http://127.0.0.1:$dash
export RAY_AUTH_MODE=token
Then submit, e.g.:
.venv/bin/ray job submit --working-dir . -- python jobs/pretrain.py paths.root=\$PWD train.epochs=2
Dashboard: http://127.0.0.1:$dash   Stop this head alone: make cluster-stop
EOF
    ;;
  stop)
    running=$(pids)
    if [ -z "$running" ]; then echo "no head of this project is running (temp dir $temp)"; exit 0; fi
    kill $running 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(pids)" ] && break; sleep 0.2; done
    left=$(pids); [ -z "$left" ] || kill -9 $left 2>/dev/null || true
    echo "stopped the Ray head in $temp"
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
