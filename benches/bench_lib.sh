# benches/bench_lib.sh — shell helpers shared by bin/bench-sse-memory and
# bin/bench-ws-fanout (sourced, not run). They build forkd, start it on a
# free loopback port with a throw-away config and data dir, find its workers
# and stop exactly what was started.
#
# Safety: loopback only; every wait is bounded; the EXIT trap stops only the
# supervisor PIDs this script started (SIGTERM, then SIGKILL after 5 s).
# Workers are found as the supervisor's children through /proc/*/stat (field
# 4, the parent pid), never by name.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FORKD_BIN=${FORKD_BIN:-$ROOT/target/release/forkd}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/forkd-bench.XXXXXX")
SUP=""
SUPS=()

bench_cleanup() {
  local pid
  for pid in "${SUPS[@]}"; do
    # Still our child (a pid that ended and was reaped may belong to anyone now).
    [ "$(parent_of "$pid")" = "$$" ] || continue
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ -n "${KEEP:-}" ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap bench_cleanup EXIT

# Raise the open-file limit for this shell and everything it starts (forkd
# and the Python client each get their own copy of it). 65536 when the hard
# limit allows, else the hard limit. Prints the limit in effect.
raise_fd_limit() {
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  ulimit -n
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

build_forkd() {
  if [ -z "${NO_BUILD:-}" ]; then
    (cd "$ROOT" && cargo build --release -q)
  fi
}

# start_forkd CONFIG [NAME]: run a supervisor in the background (log in
# $WORK/NAME.log, NAME defaults to forkd), wait up to 10 s for /health. Sets
# SUP to its pid (and adds it to SUPS, which the clean-up stops).
start_forkd() {
  local cfg=$1 log="$WORK/${2:-forkd}.log"
  env -u FORKD_CONFIG -u FORKD_BIN RUST_LOG="${RUST_LOG:-warn}" "$FORKD_BIN" serve --config "$cfg" 2>"$log" &
  SUP=$!
  SUPS+=("$SUP")
  local port
  # The first `listen` (the plain one: a [tls] section may follow with its own).
  port=$(sed -n 's/^listen = "127.0.0.1:\([0-9]*\)"$/\1/p' "$cfg" | head -1)
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 "$SUP" 2>/dev/null || break
    sleep 0.1
  done
  echo "forkd did not come up; its log:" >&2
  cat "$log" >&2
  return 1
}

# parent_of PID: its parent's pid (from /proc/PID/stat), empty if it is gone.
parent_of() {
  local st rest ppid
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  rest=${st##*) }
  read -r _ ppid _ <<<"$rest"
  echo "$ppid"
}

# children_of PID: the pids whose parent is PID (from /proc/*/stat).
children_of() {
  local f st rest ppid
  for f in /proc/[0-9]*/stat; do
    st=$(cat "$f" 2>/dev/null) || continue
    rest=${st##*) }            # drop "pid (comm) ": comm may hold spaces or ')'
    read -r _ ppid _ <<<"$rest"
    if [ "$ppid" = "$1" ]; then
      f=${f#/proc/}
      echo "${f%/stat}"
    fi
  done
}

# wait_workers COUNT [SUPERVISOR]: wait up to 10 s until the supervisor
# (default $SUP) has COUNT children; prints them, space separated.
wait_workers() {
  local want=$1 sup=${2:-$SUP} pids
  for _ in $(seq 1 100); do
    pids=$(children_of "$sup" | tr '\n' ' ')
    if [ "$(wc -w <<<"$pids")" -eq "$want" ]; then
      echo "${pids% }"
      return 0
    fi
    sleep 0.1
  done
  echo "expected $want workers under supervisor $sup, found: $pids" >&2
  return 1
}
