"""The fault-injection suite's K1 with workers that use only this package
(issue 35): `fencelock-chaos profile short --backends fencelock-py`, the
short profile's run for it, with this venv's interpreter as the workers'.

Four worker processes loop lock → fenced read → fenced write → release
through `fencelock.connect(...).lock(...)` and `fencelock.fence.Storage`;
the harness freezes holders (SIGSTOP) at their write past the TTL and wakes
them. The same checkers as for the Rust workers judge the histories: C2
(tokens increase in grant order), C3 (the storage accepted no stale token),
C4 (no lost update), S6 (progress resumes after each pause) and C8 (the
pauses happened and the late writes reached the fence and were refused)."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import chaos_bin


def test_python_workers_paused_past_their_ttl_are_fenced(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    cmd = [chaos_bin(), "profile", "short", "--backends", "fencelock-py", "--python", sys.executable, "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text
    verdicts = [json.loads(f.read_text()) for f in sorted(out.glob("*/verdict.json"))]
    assert len(verdicts) == 1, text
    v = verdicts[0]
    assert v["passed"] is True, json.dumps(v, indent=1)
    assert v["info"]["backend"] == "fencelock-py" and v["info"]["scenario"] == "K1"
    checks = {c["id"]: c["status"] for c in v["checks"]}
    for rule in ("C2", "C3", "C4", "C8", "S6"):
        assert checks[rule] == "pass", (rule, json.dumps(v, indent=1))
    stats = v["stats"]
    assert stats["faults"]["K1"] > 0 and stats["evidence"]["stopped"] > 0, stats
    assert stats["acquires"]["ok"] > 0 and stats["writes"]["ok"] > 0, stats
    # The frozen holders woke and wrote with their old tokens: the fence refused them.
    assert stats["stale_rejected"] >= v["info"]["min_stale_rejects"] >= 1, stats
