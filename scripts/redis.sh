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

SCRIPT="scripts/redis.sh"
# shellcheck source=scripts/lib/services.sh
source "$ROOT/scripts/lib/services.sh"

answers() {
  command -v redis-cli >/dev/null 2>&1 || return 1
  [ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" = "PONG" ]
}

ensure() {
  apt_install redis-server "Redis >= 6" redis-server redis-cli
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
  stop_pidfile "$PIDFILE" redis 50
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
