"""``bench/asl_scale.py`` end to end at a tiny scale: the ISLR-shaped set uploaded in parts,
split, trained by a real node and verified, with a figure for every stage, process and
disk area in its JSON line (about a minute: real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("generate", "upload", "post", "split", "node_until_first_step", "train", "verify", "post_to_settled")


def test_the_rehearsal_ends_verified_with_every_stage_measured(tmp_path: Path) -> None:
    # The bench makes its own SQLite database and var folder: none of the test run's.
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.pop("PROOFWORK_VAR_DIR", None)
    args = [sys.executable, "bench/asl_scale.py", "--scale", "0.001", "--signs", "4", "--epochs", "8"]
    args += ["--processes", "1", "--workdir", str(tmp_path / "run")]
    capped = _can_cap_memory()
    if capped:  # the node under the 4 GiB cap the full-scale rehearsal runs it with
        args += ["--node-memory", "4"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])

    # The held-out participants are drawn with a fresh secret each run: a few sequences of
    # four signs, learned well enough that any draw beats guessing.
    assert result["verified"] is True, result["assignment_reason"]
    assert (result["task_status"], result["assignment_state"]) == ("completed", "accepted")
    assert result["sequences"] == 94
    assert result["participants"] == 21
    assert result["upload_parts"] >= 1
    assert result["heldout_sequences"] > 0  # the platform kept participants back
    for stage in STAGES:
        assert isinstance(result["stages_s"][stage], float), stage
    for role in ("web", "platform", "node"):
        assert result["peak_rss_bytes"][role] > 0, role
    for area in ("generated", "upload", "platform", "node"):
        assert result["disk_peak_bytes"][area] > 0, area
    # The generated zip gave its blocks back as its parts reached the platform: at the end
    # the dataset is on the disk once (the upload's), not twice.
    assert result["disk_final_bytes"]["generated"] < 1024**2
    assert result["disk_final_bytes"]["upload"] >= result["dataset_bytes"]
    assert 0 < result["disk_total_peak_bytes"] <= sum(result["disk_peak_bytes"].values())
    assert result["node_ok"] is True
    if capped:
        assert result["node_memory_limit_bytes"] == 4 * 1024**3
        assert result["node_oom_kills"] == 0
        assert 0 < result["node_cgroup_peak_bytes"] <= 4 * 1024**3
    assert not (tmp_path / "run").exists()  # removed without --keep


def _can_cap_memory() -> bool:
    """Whether this machine lets the bench make a memory cgroup (as root, v1 or v2)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from asl_scale import MemoryCap
    finally:
        sys.path.remove(str(ROOT / "bench"))
    cap = MemoryCap.make(f"proofwork-test-{os.getpid()}", 1024**3)
    if cap is None:
        return False
    cap.remove()
    return True
