#!/usr/bin/env bash
# Lints and docs, as CI checks them: clippy with warnings as errors
# (clippy.toml: only the clock modules read the clock) and the workspace's docs
# with warnings as errors (broken intra-doc links included).
#
# Builds in target/lint, a target dir of its own: CI runs `--docs` beside the
# test run (at idle CPU priority), so it must never wait on the test build's lock.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/lint}"

# --docs: the docs only (CI lints with clippy in its test build, see .ci/run).
if [ "${1:-}" != "--docs" ]; then
    t=$(date +%s)
    cargo clippy --workspace --all-targets --locked -- -D warnings
    echo "lint.sh: clippy: $(( $(date +%s) - t )) s"
fi
t=$(date +%s)
# Not the Python package's: its users read its Python docstrings and
# python/README.md, and its pyo3 is set up by pip's build (scripts/test.sh).
# Nor fencelock-protogen's, a tool with no API (and a tenth of the build).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --exclude fencelock-python --exclude fencelock-protogen --no-deps --locked
echo "lint.sh: doc: $(( $(date +%s) - t )) s"
