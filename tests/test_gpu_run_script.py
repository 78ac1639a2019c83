"""scripts/gpu_run.sh rehearsed on the CPU (its dry run: every step it takes on the lent GPU, at tiny sizes).

Each GPU script's dry run is a file of its own: pytest-xdist's --dist loadfile hands out files with the fewest tests
last, so the two dry runs (seconds each, one test each) end the test step side by side, one per worker."""

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
    env = dict(os.environ, GPU_RUN_DRY="1", GPU_RUN_GROUPS="core", OUT=str(tmp_path), PYTHON=sys.executable)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_run.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "bench_core.json").read_text())
    assert r["complete"] and r["meta"]["sizes"] == "tiny" and r["errors"] == []
    assert "=== summary" in proc.stdout and "exit codes: core=0" in proc.stdout
