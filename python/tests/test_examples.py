"""The package's examples (python/examples, shown in the README) run as
written against a real node and print what they say."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_sync_example(node):
    lines = run(str(EXAMPLES / "sync_lock.py"), node.url).splitlines()
    assert lines[0].startswith("holding examples/orders under token ") and lines[1] == "released", lines


def test_the_asyncio_example(node):
    lines = run(str(EXAMPLES / "aio_lock.py"), node.url).splitlines()
    assert lines[0].startswith("holding examples/orders under token ") and lines[1] == "released", lines


def test_the_fenced_sql_example(node, tmp_path):
    lines = run(str(EXAMPLES / "fenced_sql.py"), node.url, str(tmp_path / "orders.db")).splitlines()
    assert lines[0].endswith(": written") and lines[1].endswith(": refused"), lines
