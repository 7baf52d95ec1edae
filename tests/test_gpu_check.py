"""tools/gpu_check.py (make gpu-check) runs its steps in order and always writes a summary;
its dry run is what a CPU machine can check of it before a GPU is at hand."""
import json
import os
import subprocess
import sys

import pytest

from conftest import CUDA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_check(tmp_path, *args):
    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--out", str(out),
                           *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    return proc, out


def test_dry_run_runs_every_step_in_order_and_summarises(tmp_path):
    proc, out = run_check(tmp_path, "--dry-run", "--skip-build", "--pytest-args",
                          "tests/test_update_scale.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = [s["step"] for s in summary["steps"]]
    assert steps == ["info", "build", "cuda-tests", "tests", "bench", "sanitizer", "racecheck", "synccheck"]
    status = {s["step"]: s["status"] for s in summary["steps"]}
    assert status["info"] == status["cuda-tests"] == status["tests"] == status["bench"] == "ok"
    assert status["build"] == status["sanitizer"] == status["racecheck"] == status["synccheck"] == "skipped"
    tests = next(s for s in summary["steps"] if s["step"] == "tests")
    assert "passed" in tests["lines"][-1]
    for step in ("info", "cuda-tests", "tests", "bench"):
        assert (out / f"{step}.log").stat().st_size > 0
    assert (out / "bench" / "results.json").exists()
    bench = next(s for s in summary["steps"] if s["step"] == "bench")
    assert any(ln.startswith("fused_amp per case, against torch's recipe") for ln in bench["lines"]), bench["lines"]
    assert "gpu-check summary" in proc.stdout and "all steps ok" in proc.stdout


def test_failures_are_reported_and_the_summary_still_written(tmp_path):
    proc, out = run_check(tmp_path, "--dry-run", "--skip-build", "--pytest-args",
                          "tests/no_such_test_file.py")
    assert proc.returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    assert "FAILED" in summary["header"]
    assert {s["step"] for s in summary["steps"] if s["status"].startswith("failed")} >= {"tests"}


@pytest.mark.skipif(CUDA, reason="with a GPU this would run the whole check")
def test_without_a_gpu_and_without_dry_run_it_says_so(tmp_path):
    proc, out = run_check(tmp_path)
    assert proc.returncode == 1
    assert "no CUDA GPU" in (out / "summary.txt").read_text()
