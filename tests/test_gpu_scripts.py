"""Phase 4's GPU scripts rehearsed on the CPU (dry runs: every step they take on the lent GPU, at tiny sizes). In
a file of their own so that the test step's two workers can run them beside the rest of Phase 4's tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.phase4

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_gpu_run_script_dry_run(tmp_path):
    env = dict(os.environ, GPU_RUN_DRY="1", GPU_RUN_GROUPS="core", OUT=str(tmp_path), PYTHON="python")
    env["PYTHONPATH"] = str(ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_run.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "bench_core.json").read_text())
    assert r["complete"] and r["meta"]["sizes"] == "tiny" and r["errors"] == []
    assert "=== summary" in proc.stdout and "exit codes: core=0" in proc.stdout


def test_gpu_suite_script_dry_run(tmp_path):
    """scripts/gpu_suite.py on CPU (tiny shapes): a row per model, a model that fails costs only its own row."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu_suite.py"), "--dry-run", "--models", "gpt2,nosuch"]
        + ["--backends", "eager", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "suite.json").read_text())
    rows = {row["model"]: row for row in r["models"]}
    if "TODO(human)" in rows["gpt2"]["reason"]:  # a practice workspace: the phase it waits for, named by its TODO
        raise NotImplementedError(rows["gpt2"]["reason"][rows["gpt2"]["reason"].index("TODO(human)") :])
    assert rows["gpt2"]["status"] in ("ok", "skipped") and rows["nosuch"]["status"] == "crashed"
    assert "unknown model" in rows["nosuch"]["reason"] and "summary:" in proc.stdout
