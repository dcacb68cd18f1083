#!/usr/bin/env bash
# The Python package's tests, as a user meets the package: a fresh virtual
# environment, `pip install ./python` (maturin builds the extension from
# PyPI's build backend), then pytest against real servers (a fencelock node
# from target/debug, Debian's redis-server). pytest's "no tests collected" is
# an exit code of its own (5), so an empty suite fails too.
#
# Speed, for CI: the extension is built with the workspace's dev profile into
# its target dir (MATURIN_PEP517_ARGS, CARGO_TARGET_DIR), so the crates the
# workspace build made already are not built again. A user's plain
# `pip install ./python` builds a release wheel.
#
# `--install` only makes the venv; `--test` only runs mypy and pytest in the
# venv made before (scripts/test.sh installs while the Rust tests run, at
# idle priority, and tests after them). No argument: both.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/py-venv
step="${1:-all}"
case "$step" in all | --install | --test) ;; *) echo "usage: $0 [--install | --test]" >&2; exit 2 ;; esac

if [ "$step" != --test ]; then
    t=$(date +%s)
    python3 -m venv --clear "$venv"
    CARGO_TARGET_DIR="$PWD/target" MATURIN_PEP517_ARGS="--profile dev --features workspace-features" \
        "$venv/bin/pip" install --quiet pytest mypy "psycopg[binary]" ./python
    echo "python-test.sh: install: $(( $(date +%s) - t )) s"
fi
[ "$step" = --install ] && exit 0

# The type stubs and the package's annotations, as a user's type checker
# reads them: the examples, the package and the chaos suite's Python worker
# (a program that uses only the package) under mypy --strict.
t=$(date +%s)
rc=0
(cd python && "../$venv/bin/python" -m mypy --strict --cache-dir /dev/null examples fencelock \
    ../crates/fencelock-chaos/python/worker.py) || rc=$?
echo "python-test.sh: mypy: $(( $(date +%s) - t )) s"

t=$(date +%s)
FENCELOCK_BIN="$PWD/target/debug/fencelock" "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests || rc=$?
echo "python-test.sh: pytest: $(( $(date +%s) - t )) s"
exit "$rc"
