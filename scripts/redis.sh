#!/usr/bin/env bash
# A private Redis for the tests: shared selection state across frontends needs a real one.
#
#   scripts/redis.sh ensure   install redis-server from Debian's packages if it is not on PATH
#   scripts/redis.sh start    start 127.0.0.1:$PARITYSERVE_REDIS_PORT (default 6390); no-op if up
#   scripts/redis.sh stop     stop the instance that `start` launched (found by its pidfile)
#   scripts/redis.sh status   say whether it answers
#   scripts/redis.sh url      print the URL the tests read from PARITYSERVE_REDIS_URL
#
# The instance keeps nothing on disk (no RDB, no AOF); its pidfile and log live under
# .cache/redis/PORT in the repository.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT="${PARITYSERVE_REDIS_PORT:-6390}"
DIR="$ROOT/.cache/redis/$PORT"
PIDFILE="$DIR/redis.pid"
LOGFILE="$DIR/redis.log"

die() { echo "scripts/redis.sh: $*" >&2; exit 1; }
say() { echo "scripts/redis.sh: $*" >&2; }

answers() {
  command -v redis-cli >/dev/null 2>&1 || return 1
  [ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" = "PONG" ]
}

ensure() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 \
      || die "redis-server is not installed and installing it needs root (or sudo); \
install the Debian package 'redis-server' yourself, then rerun"
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null 2>&1 \
    || die "redis-server is not installed and apt-get is missing; install Redis >= 6 by hand"
  say "installing redis-server with apt-get (once per machine)"
  # The package must not start a system-wide Redis on 6379: a policy-rc.d that answers 101
  # tells the maintainer scripts not to start services. Docker images usually have one.
  local policy=/usr/sbin/policy-rc.d added_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy"
    added_policy=1
  fi
  local log status=0
  log="$(mktemp)"
  {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends redis-server
  } >"$log" 2>&1 || status=$?
  if [ -n "$added_policy" ]; then $sudo rm -f "$policy"; fi
  if [ "$status" -ne 0 ]; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    die "apt-get could not install redis-server (exit $status; output above)"
  fi
  rm -f "$log"
  command -v redis-server >/dev/null 2>&1 \
    || die "apt-get finished but redis-server is still not on PATH"
}

start() {
  if answers; then
    return 0
  fi
  command -v redis-server >/dev/null 2>&1 || die "redis-server is not installed; run: $0 ensure"
  mkdir -p "$DIR"
  rm -f "$PIDFILE"
  redis-server --bind 127.0.0.1 --port "$PORT" --dir "$DIR" \
    --daemonize yes --pidfile "$PIDFILE" --logfile "$LOGFILE" \
    --save "" --appendonly no --protected-mode yes >/dev/null \
    || die "redis-server failed to start on port $PORT (see $LOGFILE)"
  local i
  for i in $(seq 1 100); do
    if answers; then
      return 0
    fi
    sleep 0.1
  done
  tail -n 20 "$LOGFILE" >&2 2>/dev/null || true
  die "redis-server on 127.0.0.1:$PORT did not answer PING within 10 s (log: $LOGFILE)"
}

stop() {
  [ -f "$PIDFILE" ] || return 0
  local pid i
  pid="$(cat "$PIDFILE")"
  # Only a live redis-server: a stale pidfile may name a pid that now belongs to another process.
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
      && grep -q '^redis' "/proc/$pid/comm" 2>/dev/null; then
    kill "$pid"
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  ensure) ensure ;;
  start) start ;;
  stop) stop ;;
  status)
    if answers; then echo "redis on 127.0.0.1:$PORT answers"; else echo "redis on 127.0.0.1:$PORT is down"; exit 1; fi ;;
  url) echo "redis://127.0.0.1:$PORT/0" ;;
  *) die "usage: $0 ensure|start|stop|status|url" ;;
esac
