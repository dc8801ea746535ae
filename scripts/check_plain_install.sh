#!/usr/bin/env bash
# A real install, as a new user makes it: a throwaway venv, `pip install .` with no extras and
# the plain check (tests/e2e/plain_install_check.py plain), then `pip install '.[torch]'` in
# the same venv and the torch check. Each step is timed; the table goes to stdout and, with
# $CHECK_PLAIN_INSTALL_TIMES set, to that file.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${PLAIN_VENV:-.cache/plain-venv}"
ROOT="$(pwd)"
CHECK="$ROOT/tests/e2e/plain_install_check.py"
times=()

step() {  # step NAME COMMAND...: run it, and keep how long it took
  local name="$1" t0 t1
  shift
  echo "== $name"
  t0=$SECONDS
  "$@"
  t1=$SECONDS
  times+=("| $name | $((t1 - t0)) s |")
}

check() {  # from inside the venv's folder: the installed package, not the checkout, is imported
  (cd "$VENV" && PARITYSERVE_HOME=home bin/python "$CHECK" "$1")
}

same_modules() {  # the installed package holds exactly the checkout's modules, no more
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  diff <(cd "$ROOT" && find parityserve -name '*.py' -not -path '*/__pycache__/*' | sort) \
       <(cd "$site" && find parityserve -name '*.py' -not -path '*/__pycache__/*' | sort)
}

rm -rf "$VENV"
# pip builds the wheel in ./build, and setuptools never removes a file from it: a module moved
# out of the package (issue 40 moved three to benchmarks/) would still ship from there.
rm -rf "$ROOT/build"
step "python -m venv" "$PYTHON" -m venv "$VENV"
step "pip install . (no extras)" "$VENV/bin/pip" install --quiet --disable-pip-version-check .
step "the wheel ships the checkout's modules, and only them" same_modules
step "plain check: serve python:, sklearn and zoo models; refuse a graph" check plain
step "pip install '.[torch]' (same venv)" "$VENV/bin/pip" install --quiet \
  --disable-pip-version-check '.[torch]'
step "torch check: serve a torch: model and the README's graph" check torch

table=$(printf '| step | time |\n|---|---|\n'; printf '%s\n' "${times[@]}")
echo "$table"
if [ -n "${CHECK_PLAIN_INSTALL_TIMES:-}" ]; then echo "$table" > "$CHECK_PLAIN_INSTALL_TIMES"; fi
