#!/usr/bin/env bash
# The whole fencelock test suite, as the README and .ci/run call it.
#
# Installs what the tests need on a fresh machine (Debian's PostgreSQL and
# Redis, cargo-nextest), then runs every test of the workspace with nextest:
# unit and property tests, and the end-to-end tests that start real
# `fencelock` processes and real servers on free ports of 127.0.0.1; the doc
# examples; then the Python package's suite (scripts/python-test.sh). Each
# crate's integration tests are one binary, `tests/it/` (linking is most of a
# build's time on 2 cores). Prints how long each phase took.
#
# `--docs` (first, before nextest's arguments; CI's): also checks the docs
# (scripts/lint.sh --docs) beside the tests, in this build's target dir.
set -euo pipefail
cd "$(dirname "$0")/.."
docs=0
if [ "${1:-}" = "--docs" ]; then
    docs=1
    shift
fi

t=$(date +%s)
scripts/install-test-deps.sh
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: installing cargo-nextest"
    cargo install cargo-nextest --locked
fi
echo "test.sh: install: $(( $(date +%s) - t )) s"

# All but two packages. The Python package has no Rust tests (its tests are
# pytest's, below), and pip builds it for the venv's Python anyway (pyo3 set
# up for another interpreter is another build), with the flags of this one.
# fencelock-protogen is a tool run by hand when a .proto file changes
# (fencelock-proto's build script checks that its output is current); its
# protox and prost-build were a tenth of this build.
not_built=(--exclude fencelock-python --exclude fencelock-protogen)
t=$(date +%s)
cargo build --workspace "${not_built[@]}" --all-targets --locked
echo "test.sh: build: $(( $(date +%s) - t )) s"

# Beside the Rust tests, at idle CPU priority (they take only the cycles the
# tests leave, and never slow their timers), once nextest has started its
# tests (until then it holds cargo's lock on the build dir): the doc
# examples are compiled (`cargo test --doc`; `no_run` where they need a
# server), with --docs the docs are checked, and the Python package is
# pip-installed into a fresh venv (its tests run after the Rust ones). All
# reuse the build above: the docs in its target dir (not lint.sh's own,
# which compiled every proc macro and build script again, about a fifth of
# the build's CPU) need only the other dependencies checked.
idle=()
if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0); fi
# The docs at idle disk priority too (mq-deadline honours it): the tests' fsyncs first.
idle_io=("${idle[@]}")
if ionice -c3 true 2>/dev/null; then idle_io+=(ionice -c3); fi
run_log=$(mktemp)
beside_log=$(mktemp)
(
    for _ in $(seq 600); do
        grep -q "Starting [0-9]* test" "$run_log" 2>/dev/null && break
        sleep 0.5
    done
    # The doc examples and the docs first: pip's build sets pyo3 up for the
    # venv's Python, which the workspace build's pyo3 would then be built
    # again to undo.
    beside_rc=0
    t=$(date +%s)
    "${idle[@]}" cargo test --doc --workspace "${not_built[@]}" --locked || beside_rc=1
    echo "test.sh: doc examples: $(( $(date +%s) - t )) s"
    if [ "$docs" = 1 ]; then
        CARGO_TARGET_DIR="$PWD/target" "${idle_io[@]}" scripts/lint.sh --docs || beside_rc=1
    fi
    "${idle[@]}" scripts/python-test.sh --install || beside_rc=1
    exit "$beside_rc"
) >"$beside_log" 2>&1 &
beside=$!

t=$(date +%s)
rc=0
cargo nextest run --workspace "${not_built[@]}" --locked --no-fail-fast "$@" 2>&1 | tee "$run_log" || rc=$?
echo "test.sh: run: $(( $(date +%s) - t )) s"

t=$(date +%s)
beside_rc=0
wait "$beside" || beside_rc=$?
cat "$beside_log"
echo "test.sh: Python install, doc examples and docs, waited for after the run: $(( $(date +%s) - t )) s"
if [ "$beside_rc" -ne 0 ]; then
    echo "test.sh: the Python package did not install, a doc example failed, or the docs did not build"
    rc=1
fi
t=$(date +%s)
scripts/python-test.sh --test || rc=$?
echo "test.sh: python: $(( $(date +%s) - t )) s"
exit "$rc"
