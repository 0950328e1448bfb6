"""bench/gpu_campaign.py in its smoke form on the CPU, so the GPU command cannot rot between GPU runs."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from dataclasses import replace

import pandas as pd
import pytest

from tuner.config import RunConfig

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
def test_the_gpu_check_and_the_campaign_run_in_miniature_without_ray_or_optuna_adding_to_one_folder(tmp_path):
    """bench/gpu_check.py --smoke (its four stages, compiled), then campaign commands adding their stages to the same
    folder: the eager checks join the compiled one, and a later command starts no finished run again."""
    out = tmp_path / "campaign"
    env = without_ray_and_optuna(tmp_path)
    check = subprocess.run([sys.executable, str(ROOT / "bench/gpu_check.py"), "--smoke", "--device", "cpu", "--parallel", "1", "--out", str(out)],
                           env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]
    assert printed_stages(check) == ["environment", "correctness", "speed", "profile"]  # one line per stage, in order
    results = json.loads((out / "campaign.json").read_text())
    assert not [s for s in results if "error" in results[s]]
    assert results["environment"]["packages"]["torch"] and "cvxpy" in results["environment"]["packages"] and results["environment"]["commit"]
    compiled = results["correctness"]["checks"]["compiled: fedavg"]
    assert compiled["status"] == "passed" and compiled["programs"] > 0 and compiled["inductor"] == "torch's default Inductor configuration"
    figures = results["speed"]["figures"]
    assert set(figures) == {"fedavg"}
    assert {"eager s/round", "compiled s/round", "% of chain bound", "compiled whole round s", "graph calls", "graph skips"} <= set(figures["fedavg"])
    assert figures["fedavg"]["recompiles"] == figures["fedavg"]["second trial programs"] == 0 < figures["fedavg"]["programs"]
    assert figures["fedavg"]["% of ceiling"] > 0
    assert results["profile"]["top"] and results["profile"]["wall_s"] > 0 and "graph calls" in results["profile"]

    command = [sys.executable, str(ROOT / "bench/gpu_campaign.py"), "--smoke", "--device", "cpu", "--out", str(out), "--columns", "fedpac-20"]
    proc = subprocess.run([*command, "--stages", "correctness,sharing,real-run"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert printed_stages(proc) == ["correctness", "sharing", "real run"]
    results = json.loads((out / "campaign.json").read_text())
    assert list(results) == STAGES and not [s for s in STAGES if "error" in results[s]]
    checks = results["correctness"]["checks"]  # the check's compiled one kept beside the campaign's eager ones
    assert {"compiled: fedavg", "executors equal: fedpac", "ResNet-18 BatchNorm under vmap", "exact resume on the device"} <= set(checks)
    assert all(c["status"] == "passed" for c in checks.values()), checks
    assert set(results["sharing"]["rounds_per_second"]) == {"1", "2"} and "MPS: not on this node" in results["sharing"]["line"]
    runs = results["real run"]["runs"]  # FedPAC Table 1's first two rows, in miniature
    assert set(runs) == {"fedpac-20/local", "fedpac-20/fedavg"} and all(r["finished"] and r["rounds"] == 2 for r in runs.values())
    assert len(pd.read_parquet(out / "runs/fedpac-20/local/metrics.parquet")) == 2  # a run `tuner report` reads
    summary = (out / "summary.md").read_text()
    assert all(f"| {s} |" in summary for s in STAGES)

    later = subprocess.run([*command, "--stages", "real-run"], env=env, capture_output=True, text=True, timeout=600)
    assert later.returncode == 0, later.stderr[-2000:]
    ran = [line for line in (out / "runs/fedpac-20/local.log").read_text().splitlines() if "rounds run" in line]
    assert len(ran) == 1 and json.loads((out / "campaign.json").read_text())["real run"]["runs"]["fedpac-20/local"]["finished"]
    assert len(pd.read_parquet(out / "runs/fedpac-20/local/metrics.parquet")) == 2  # no round twice


def printed_stages(proc) -> list[str]:
    return [line.split("]")[0].strip("[") for line in proc.stdout.splitlines() if line.startswith("[")]


def test_the_compiled_figures_and_checks_refuse_a_run_that_went_on_eager(compiling_fails):
    """The campaign's and the check's correctness, the speed figures and the compile bench all read what ran: with
    every compile failing they fail, although the eager numbers they would otherwise compare are right."""
    campaign = load_campaign()  # puts the checkout on the path, for bench's modules
    from bench.compile_once import trial_seconds
    from bench.engine_speed import NotCompiled, measure

    cfg = RunConfig(method="fedavg", dataset="digits", partition="dir:0.3", clients=4, batch_size=40, dtype="float64", engine="compiled")
    with pytest.raises(AssertionError, match="the compiled run went on eager"):
        campaign.executors_equal(cfg, "cpu", rounds=1)
    campaign.executors_equal(replace(cfg, engine="eager"), "cpu", rounds=1)  # the same check of an eager run asks nothing of it
    with pytest.raises(NotCompiled, match="fedavg's compiled run went on eager"):
        measure("fedavg", "cpu", rounds=1, dataset="digits", partition="dir:0.3", clients=4, batch_size=40, backbone="mlp")
    with pytest.raises(RuntimeError, match="the compiled trial went on eager"):
        trial_seconds(rounds=2, clients=4)


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
