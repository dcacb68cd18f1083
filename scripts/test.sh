#!/usr/bin/env bash
# The whole fencelock test suite, as the README and .ci/run call it.
#
# Installs what the tests need on a fresh machine (Debian's PostgreSQL and
# Redis, cargo-nextest), then runs every test of the workspace with nextest:
# unit and property tests, and the end-to-end tests that start real
# `fencelock` processes and real servers on free ports of 127.0.0.1; then the
# Python package's suite (scripts/python-test.sh). Each
# crate's integration tests are one binary, `tests/it/` (linking is most of a
# build's time on 2 cores). Prints how long each phase took.
set -euo pipefail
cd "$(dirname "$0")/.."

t=$(date +%s)
scripts/install-test-deps.sh
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: installing cargo-nextest"
    cargo install cargo-nextest --locked
fi
echo "test.sh: install: $(( $(date +%s) - t )) s"

t=$(date +%s)
cargo build --workspace --all-targets --locked
echo "test.sh: build: $(( $(date +%s) - t )) s"

# The Python package is pip-installed into a fresh venv while the Rust tests
# run, at idle CPU priority (it takes only the cycles the tests leave, and
# never slows their timers; the build above made what it reuses); its tests
# run after them.
idle=()
if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0); fi
py_log=$(mktemp)
"${idle[@]}" scripts/python-test.sh --install >"$py_log" 2>&1 &
py_install=$!

t=$(date +%s)
rc=0
cargo nextest run --workspace --locked --no-fail-fast "$@" || rc=$?
echo "test.sh: run: $(( $(date +%s) - t )) s"

t=$(date +%s)
py_rc=0
wait "$py_install" || py_rc=$?
cat "$py_log"
echo "test.sh: python install, waited for after the run: $(( $(date +%s) - t )) s"
if [ "$py_rc" -ne 0 ]; then
    echo "test.sh: the Python package did not install (exit $py_rc)"
    exit "$py_rc"
fi
t=$(date +%s)
scripts/python-test.sh --test || rc=$?
echo "test.sh: python: $(( $(date +%s) - t )) s"
exit "$rc"
