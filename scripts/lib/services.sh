# Shared by scripts/redis.sh and scripts/prometheus.sh (sourced, not run): install a server from
# Debian's packages without starting a system-wide copy, and stop the private instance a
# script started, found by its pidfile. The caller sets SCRIPT (its name, for messages).

die() { echo "$SCRIPT: $*" >&2; exit 1; }
say() { echo "$SCRIPT: $*" >&2; }

# apt_install PACKAGE WHAT BINARY...: install PACKAGE unless every BINARY is on PATH already.
# WHAT names the minimum version to install by hand where apt-get is missing.
apt_install() {
  local package="$1" what="$2" binary missing=""
  shift 2
  for binary in "$@"; do
    command -v "$binary" >/dev/null 2>&1 || missing=1
  done
  [ -n "$missing" ] || return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 \
      || die "$package is not installed and installing it needs root (or sudo); \
install the Debian package '$package' yourself, then rerun"
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null 2>&1 \
    || die "$package is not installed and apt-get is missing; install $what by hand"
  say "installing $package with apt-get (once per machine)"
  # The package must not start a system-wide server on its default port: a policy-rc.d that
  # answers 101 tells the maintainer scripts not to start services. Docker images usually
  # have one.
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
        --no-install-recommends "$package"
  } >"$log" 2>&1 || status=$?
  if [ -n "$added_policy" ]; then $sudo rm -f "$policy"; fi
  if [ "$status" -ne 0 ]; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    die "apt-get could not install $package (exit $status; output above)"
  fi
  rm -f "$log"
  for binary in "$@"; do
    command -v "$binary" >/dev/null 2>&1 \
      || die "apt-get finished but $binary is still not on PATH"
  done
}

# stop_pidfile PIDFILE COMM TENTHS: stop the process PIDFILE names if it is alive and its
# command name starts with COMM (a stale pidfile may name a pid that now belongs to another
# process); SIGTERM, then SIGKILL after TENTHS tenths of a second.
stop_pidfile() {
  local pidfile="$1" comm="$2" tenths="$3" pid i
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
      && grep -q "^$comm" "/proc/$pid/comm" 2>/dev/null; then
    kill "$pid"
    for i in $(seq 1 "$tenths"); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}
