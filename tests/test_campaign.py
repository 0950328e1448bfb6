"""bench/gpu_campaign.py in its smoke form on the CPU, so the GPU command cannot rot between GPU runs."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["environment", "correctness", "speed", "profile", "sharing", "real run"]


def without_ray_and_optuna(tmp_path: Path) -> dict:
    """An environment where importing ray or optuna fails, as on a bare GPU node (the campaign's runs inherit it)."""
    blocked = tmp_path / "blocked"
    for name in ("ray", "optuna"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed on this node')\n")
    return {**os.environ, "PYTHONPATH": f"{blocked}:{ROOT}", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_campaign_smoke_runs_every_stage_without_ray_or_optuna_and_a_later_command_adds_to_it(tmp_path):
    out = tmp_path / "campaign"
    command = [sys.executable, str(ROOT / "bench/gpu_campaign.py"), "--smoke", "--device", "cpu", "--out", str(out)]
    env = without_ray_and_optuna(tmp_path)
    proc = subprocess.run([*command, "--columns", "fedpac-20"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = [line.split("]")[0].strip("[") for line in proc.stdout.splitlines() if line.startswith("[")]
    assert printed == STAGES  # one line per stage, in order
    results = json.loads((out / "campaign.json").read_text())
    assert list(results) == STAGES and not [s for s in STAGES if "error" in results[s]]
    assert results["environment"]["packages"]["torch"] and "cvxpy" in results["environment"]["packages"]
    checks = results["correctness"]["checks"]
    assert {"executors equal: fedpac", "ResNet-18 BatchNorm under vmap", "exact resume on the device"} <= set(checks)
    assert all(c["status"] == "passed" for c in checks.values()), checks
    figures = results["speed"]["figures"]
    assert set(figures) == {"fedavg"}
    assert all({"eager s/round", "compiled s/round", "% of chain bound", "compiled whole round s"} <= set(f) and f["recompiles"] == 0 for f in figures.values())
    assert figures["fedavg"]["% of ceiling"] > 0
    assert results["profile"]["top"] and results["profile"]["wall_s"] > 0
    assert set(results["sharing"]["rounds_per_second"]) == {"1", "2"} and "MPS: not on this node" in results["sharing"]["line"]
    runs = results["real run"]["runs"]  # FedPAC Table 1's first two rows, in miniature
    assert set(runs) == {"fedpac-20/local", "fedpac-20/fedavg"} and all(r["finished"] and r["rounds"] == 2 for r in runs.values())
    assert len(pd.read_parquet(out / "runs/fedpac-20/local/metrics.parquet")) == 2  # a run `tuner report` reads
    summary = (out / "summary.md").read_text()
    assert all(f"| {s} |" in summary for s in STAGES)

    # A later command runs the stages it names, adds its checks to the earlier ones, and starts no finished run again.
    later = subprocess.run([*command, "--stages", "correctness,real-run", "--methods", "fedcp-gumbel", "--engine", "compiled", "--columns", "fedpac-20"],
                           env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert later.returncode == 0, later.stderr[-2000:]
    assert [line.split("]")[0].strip("[") for line in later.stdout.splitlines() if line.startswith("[")] == ["correctness", "real run"]
    results = json.loads((out / "campaign.json").read_text())
    assert list(results) == STAGES and results["speed"]["figures"].keys() == {"fedavg"}  # the first command's stages kept
    checks = results["correctness"]["checks"]
    assert checks["executors equal: fedpac"]["status"] == checks["executors equal (compiled): fedcp-gumbel"]["status"] == "passed"
    ran = [line for line in (out / "runs/fedpac-20/local.log").read_text().splitlines() if "rounds run" in line]
    assert len(ran) == 1 and results["real run"]["runs"]["fedpac-20/local"]["finished"]
    assert len(pd.read_parquet(out / "runs/fedpac-20/local/metrics.parquet")) == 2  # no round twice


def load_campaign():
    spec = importlib.util.spec_from_file_location("gpu_campaign", ROOT / "bench/gpu_campaign.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_failing_check_or_stage_is_recorded_and_the_campaign_goes_on(tmp_path):
    campaign = load_campaign()

    def broken():
        raise AssertionError("vectorized differs from sequential")

    failed = campaign._check(float("inf"), broken)
    assert failed["status"] == "failed" and "vectorized differs" in failed["message"]
    assert campaign._check(0.0, broken) == {"status": "skipped"}  # past its stage's time: not run, said so

    args = type("Args", (), {"out": str(tmp_path), "device": "cpu", "data": None, "budget_min": 1.0, "smoke": True, "stages": "speed,environment",
                             "methods": None, "engine": "eager", "columns": "fedpac-20"})()  # fmt: skip
    c = campaign.Campaign(args)
    c.stage("speed", lambda deadline: 1 / 0)
    c.stage("environment", c.environment)
    results = json.loads((tmp_path / "campaign.json").read_text())
    assert "ZeroDivisionError" in results["speed"]["error"] and results["environment"]["device"] == "cpu"
    assert "| speed | ZeroDivisionError" in (tmp_path / "summary.md").read_text()
