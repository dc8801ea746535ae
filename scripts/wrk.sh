#!/usr/bin/env bash
# The outside load tool of benchmarks.frontend_wrk and benchmarks.frontend_shards.
#
#   scripts/wrk.sh ensure   install wrk from Debian's packages if it is not on PATH
set -euo pipefail

die() { echo "scripts/wrk.sh: $*" >&2; exit 1; }

ensure() {
  command -v wrk >/dev/null 2>&1 && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 \
      || die "wrk is not installed and installing it needs root (or sudo); install the \
Debian package 'wrk' yourself, then rerun"
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null 2>&1 || die "wrk is not installed and apt-get is missing"
  echo "scripts/wrk.sh: installing wrk with apt-get (once per machine)" >&2
  local log
  log="$(mktemp)"
  { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk
  } >"$log" 2>&1 || { tail -20 "$log" >&2; die "apt-get could not install wrk"; }
  rm -f "$log"
  command -v wrk >/dev/null 2>&1 || die "apt-get finished but wrk is not on PATH"
}

case "${1:-}" in
  ensure) ensure ;;
  *) die "usage: scripts/wrk.sh ensure" ;;
esac
