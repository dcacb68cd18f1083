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

t=$(date +%s)
rc=0
cargo nextest run --workspace --locked --no-fail-fast "$@" || rc=$?
echo "test.sh: run: $(( $(date +%s) - t )) s"

# The Python package: pip-installed into a fresh venv, then its pytest suite.
t=$(date +%s)
scripts/python-test.sh || rc=$?
echo "test.sh: python: $(( $(date +%s) - t )) s"
exit "$rc"
