#!/usr/bin/env bash
# A private Prometheus for the observability tests: the dashboard's and the rules' PromQL is
# evaluated by a real one, scraping a real parityserve.
#
#   scripts/prometheus.sh ensure            install prometheus (and promtool) from Debian's
#                                           packages if they are not on PATH
#   scripts/prometheus.sh start TARGET [RULES]
#                                           scrape TARGET (host:port of a parityserve) every
#                                           second, with RULES (a rules file) evaluated every
#                                           second, on 127.0.0.1:$PARITYSERVE_PROMETHEUS_PORT
#                                           (default 9390); restarts an instance already up
#   scripts/prometheus.sh stop              stop the instance that `start` launched (pidfile)
#   scripts/prometheus.sh status            say whether it answers
#   scripts/prometheus.sh url               print its base URL
#
# The config, the TSDB, the pidfile and the log live under .cache/prometheus/PORT in the
# repository; `start` wipes the TSDB so every run begins empty.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT="${PARITYSERVE_PROMETHEUS_PORT:-9390}"
DIR="$ROOT/.cache/prometheus/$PORT"
PIDFILE="$DIR/prometheus.pid"
LOGFILE="$DIR/prometheus.log"
CONFIG="$DIR/prometheus.yml"

SCRIPT="scripts/prometheus.sh"
# shellcheck source=scripts/lib/services.sh
source "$ROOT/scripts/lib/services.sh"

answers() {
  python3 - "$PORT" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/-/ready", timeout=2).read()
EOF
}

ensure() {
  apt_install prometheus "Prometheus >= 2.30" prometheus promtool
}

write_config() {
  local target="$1" rules="${2:-}"
  {
    echo "global:"
    echo "  scrape_interval: 1s"
    echo "  evaluation_interval: 1s"
    if [ -n "$rules" ]; then
      echo "rule_files:"
      echo "  - '$rules'"
    fi
    echo "scrape_configs:"
    echo "  - job_name: parityserve"
    echo "    static_configs:"
    echo "      - targets: ['$target']"
  } >"$CONFIG"
}

start() {
  local target="${1:-}" rules="${2:-}"
  [ -n "$target" ] || die "usage: $0 start HOST:PORT [RULES_FILE]"
  command -v prometheus >/dev/null 2>&1 || die "prometheus is not installed; run: $0 ensure"
  if [ -n "$rules" ]; then
    [ -f "$rules" ] || die "no rules file at $rules"
    rules="$(cd "$(dirname "$rules")" && pwd)/$(basename "$rules")"
  fi
  stop
  mkdir -p "$DIR"
  rm -rf "$DIR/data"
  write_config "$target" "$rules"
  # --web.enable-lifecycle lets a test reload rules; the TSDB keeps 1 h, enough for any test.
  prometheus --config.file="$CONFIG" --storage.tsdb.path="$DIR/data" \
    --storage.tsdb.retention.time=1h --web.listen-address="127.0.0.1:$PORT" \
    --web.enable-lifecycle >"$LOGFILE" 2>&1 &
  echo $! >"$PIDFILE"
  local i
  for i in $(seq 1 300); do
    if answers; then
      return 0
    fi
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 20 "$LOGFILE" >&2 2>/dev/null || true
  die "prometheus on 127.0.0.1:$PORT was not ready within 30 s (log: $LOGFILE)"
}

stop() {
  stop_pidfile "$PIDFILE" prometheus 100
}

case "${1:-}" in
  ensure) ensure ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  status)
    if answers; then echo "prometheus on 127.0.0.1:$PORT answers"; else echo "prometheus on 127.0.0.1:$PORT is down"; exit 1; fi ;;
  url) echo "http://127.0.0.1:$PORT" ;;
  *) die "usage: $0 ensure|start HOST:PORT [RULES]|stop|status|url" ;;
esac
