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

die() { echo "scripts/prometheus.sh: $*" >&2; exit 1; }
say() { echo "scripts/prometheus.sh: $*" >&2; }

answers() {
  python3 - "$PORT" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/-/ready", timeout=2).read()
EOF
}

ensure() {
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 \
      || die "prometheus is not installed and installing it needs root (or sudo); \
install the Debian package 'prometheus' yourself, then rerun"
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null 2>&1 \
    || die "prometheus is not installed and apt-get is missing; install Prometheus >= 2.30 by hand"
  say "installing prometheus with apt-get (once per machine)"
  # The package must not start a system-wide Prometheus on 9090: a policy-rc.d that answers 101
  # tells the maintainer scripts not to start services.
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
        --no-install-recommends prometheus
  } >"$log" 2>&1 || status=$?
  if [ -n "$added_policy" ]; then $sudo rm -f "$policy"; fi
  if [ "$status" -ne 0 ]; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    die "apt-get could not install prometheus (exit $status; output above)"
  fi
  rm -f "$log"
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 \
    || die "apt-get finished but prometheus or promtool is still not on PATH"
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
  [ -f "$PIDFILE" ] || return 0
  local pid i
  pid="$(cat "$PIDFILE")"
  # Only a live prometheus: a stale pidfile may name a pid that now belongs to another process.
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
      && grep -q '^prometheus' "/proc/$pid/comm" 2>/dev/null; then
    kill "$pid"
    for i in $(seq 1 100); do
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
  start) shift; start "$@" ;;
  stop) stop ;;
  status)
    if answers; then echo "prometheus on 127.0.0.1:$PORT answers"; else echo "prometheus on 127.0.0.1:$PORT is down"; exit 1; fi ;;
  url) echo "http://127.0.0.1:$PORT" ;;
  *) die "usage: $0 ensure|start HOST:PORT [RULES]|stop|status|url" ;;
esac
