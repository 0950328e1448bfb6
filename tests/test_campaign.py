"""bench/gpu_campaign.py in its smoke form on the CPU, so the GPU command cannot rot between GPU runs."""

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from tuner.cli import app
from tuner.settings.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
# as campaign.json holds them: the check's, then the campaign's
STAGES = ["environment", "correctness", "speed", "profile", "conv forms", "blocks", "sharing", "real run"]


def without_ray_and_optuna(tmp_path: Path) -> dict:
    """An environment where importing ray or optuna fails, as on a bare GPU node (the campaign's runs inherit it)."""
    blocked = tmp_path / "blocked"
    for name in ("ray", "optuna"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed on this node')\n")
    return {**os.environ, "PYTHONPATH": f"{blocked}:{ROOT}", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_the_gpu_check_and_the_campaign_run_in_miniature_without_ray_or_optuna_adding_to_one_folder(
    tmp_path, monkeypatch
):
    """bench/gpu_check.py --smoke (its six stages, compiled), then campaign commands adding their stages to the same
    folder: the eager checks join the compiled one, and a later command starts no finished run again."""
    out = tmp_path / "campaign"
    env = without_ray_and_optuna(tmp_path)
    check = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/gpu_check.py"),
            "--smoke",
            "--device",
            "cpu",
            "--parallel",
            "1",
            "--out",
            str(out),
            "--stages",
            "environment,correctness,speed,profile,conv-forms,blocks",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert check.returncode == 0, check.stderr[-2000:]
    # one line per stage, in order
    assert printed_stages(check) == ["environment", "correctness", "speed", "profile", "conv forms", "blocks"]
    results = json.loads((out / "campaign.json").read_text())
    assert not [s for s in results if "error" in results[s]]
    assert (
        results["environment"]["packages"]["torch"]
        and "cvxpy" in results["environment"]["packages"]
        and results["environment"]["commit"]
    )
    compiled = results["correctness"]["checks"]["compiled: fedavg on mlp"]
    assert (
        compiled["status"] == "passed"
        and compiled["programs"] > 0
        and compiled["inductor"] == "torch's default Inductor configuration"
    )
    figures = results["speed"]["figures"]
    assert set(figures) == {"fedavg"}
    assert {
        "eager s/round",
        "compiled s/round",
        "% of chain bound",
        "compiled whole round s",
        "graph calls",
        "graph skips",
    } <= set(figures["fedavg"])
    assert (
        figures["fedavg"]["recompiles"]
        == figures["fedavg"]["second trial programs"]
        == 0
        < figures["fedavg"]["programs"]
    )
    assert figures["fedavg"]["% of ceiling"] > 0
    assert set(results["blocks"]["figures"]) == {"K=1", "K=2"}
    assert {f["steps a round"] for f in results["blocks"]["figures"].values()} != {0}
    assert set(results["conv forms"]["forms"]) == {"grouped", "unfold"}
    prof = results["profile"]
    assert prof["top"] and prof["steps_s"] > 0 and prof["window_s"] > 0 and "graph calls" in prof
    assert set(prof["step_s_by_width"]) == {"1", "2", "4"} and min(prof["step_s_by_width"].values()) > 0
    assert "pfl-tuner: timed window" not in {k["name"] for k in prof["top"]}  # the window is no kernel

    command = [
        sys.executable,
        str(ROOT / "bench/gpu_campaign.py"),
        "--smoke",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--columns",
        "fedpac-20",
        "--seeds",
        "1",
        "--committed",
        str(tmp_path / "committed"),
    ]
    proc = subprocess.run(
        [*command, "--stages", "correctness,sharing,real-run"], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert printed_stages(proc) == ["correctness", "sharing", "real run"]
    results = json.loads((out / "campaign.json").read_text())
    assert list(results) == STAGES and not [s for s in STAGES if "error" in results[s]]
    checks = results["correctness"]["checks"]  # the check's compiled one kept beside the campaign's eager ones
    assert {
        "compiled: fedavg on mlp",
        "executors equal: fedpac on mlp",
        "ResNet-18 BatchNorm under vmap",
        "exact resume on the device",
    } <= set(checks)
    assert all(c["status"] == "passed" for c in checks.values()), checks
    assert (
        set(results["sharing"]["rounds_per_second"]) == {"1", "2"}
        and "MPS: not on this node" in results["sharing"]["line"]
    )
    runs = results["real run"]["runs"]  # FedPAC Table 1's first two rows, in miniature
    assert set(runs) == {"fedpac-20/local-seed0", "fedpac-20/fedavg-seed0"} and all(
        r["finished"] and r["rounds"] == 2 for r in runs.values()
    )
    assert len(pd.read_parquet(out / "runs/fedpac-20/local-seed0/metrics.parquet")) == 2  # a run `tuner report` reads
    # the runs come back as archive pieces, and `tuner report` rebuilds the column from what they hold
    assert results["real run"]["archive"] == ["runs.tar.xz.00"]
    back = tmp_path / "back"
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in sorted(out.glob("runs.tar.xz.*"))))) as tar:
        tar.extractall(back, filter="data")
    assert sorted(p.name for p in (back / "runs/fedpac-20/local-seed0").iterdir()) == [
        "config.yaml",
        "environment.json",
        "metrics.parquet",
    ]
    report = CliRunner().invoke(app, ["report", str(back / "runs"), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0 and "2 runs (0 failed)" in report.output, report.output
    rows = pd.read_parquet(tmp_path / "report/runs.parquet")
    assert set(rows["device"]) == {f"CPU ({os.cpu_count()} cores)"} and set(rows["torch"]) == {torch.__version__}
    assert rows["commit"].str.fullmatch(r"[0-9a-f]{7}(\+changes)?").all()  # where each row's rounds ran
    summary = (out / "summary.md").read_text()
    assert all(f"| {s} |" in summary for s in STAGES)

    # a later command, here: what it would start, it starts
    monkeypatch.setattr(sys, "argv", [*command[1:], "--stages", "real-run"])
    load_campaign().main()
    ran = [line for line in (out / "runs/fedpac-20/local-seed0.log").read_text().splitlines() if "rounds run" in line]
    assert (
        len(ran) == 1
        and json.loads((out / "campaign.json").read_text())["real run"]["runs"]["fedpac-20/local-seed0"]["finished"]
    )
    assert len(pd.read_parquet(out / "runs/fedpac-20/local-seed0/metrics.parquet")) == 2  # no round twice

    # the runs committed (unpacked from the archive), a new session's command with a second seed runs only that
    later = tmp_path / "later"
    argv = [*command[1:], "--stages", "real-run", "--seeds", "2", "--committed", str(back / "runs"), "--out"]
    monkeypatch.setattr(sys, "argv", [*argv, str(later)])
    load_campaign().main()
    runs = json.loads((later / "campaign.json").read_text())["real run"]["runs"]
    assert {k for k, v in runs.items() if v.get("where") == str(back / "runs")} == {
        "fedpac-20/local-seed0",
        "fedpac-20/fedavg-seed0",
    }
    assert sorted(p.parent.name for p in (later / "runs/fedpac-20").glob("*/metrics.parquet")) == [
        "fedavg-seed1",
        "local-seed1",
    ]
    # the column rebuilt from the union of both sessions' runs
    report = CliRunner().invoke(app, ["report", str(back / "runs"), str(later / "runs"), "--out", str(later / "r")])
    assert report.exit_code == 0 and "4 runs (0 failed)" in report.output, report.output


def printed_stages(proc) -> list[str]:
    return [line.split("]")[0].strip("[") for line in proc.stdout.splitlines() if line.startswith("[")]


def test_the_compiled_figures_and_checks_refuse_a_run_that_went_on_eager(compiling_fails):
    """The campaign's and the check's correctness, the speed figures and the compile bench all read what ran: with
    every compile failing they fail, although the eager numbers they would otherwise compare are right."""
    campaign = load_campaign()  # puts the checkout on the path, for bench's modules
    from bench.compile_once import trial_seconds
    from bench.engine_speed import NotCompiled, measure

    cfg = RunConfig(
        method="fedavg",
        dataset="digits",
        partition="dir:0.3",
        clients=4,
        batch_size=40,
        dtype="float64",
        engine="compiled",
    )
    with pytest.raises(AssertionError, match="the compiled run went on eager") as failed:
        campaign.executors_equal(cfg, "cpu", rounds=1)
    # the whole error, for a bug report (pFedMe's on the H200 was cut to its first line)
    assert "the cause, on a later line" in str(failed.value)
    # the same check of an eager run asks nothing of it
    campaign.executors_equal(replace(cfg, engine="eager"), "cpu", rounds=1)
    figures: dict = {}
    with pytest.raises(NotCompiled, match="fedavg's compiled run went on eager"):
        measure("fedavg", "cpu", rounds=1, out=figures, **SMOKE_SPEED)
    # the eager figure stays; the fallback's time is never written as the compiled one
    assert figures["eager s/round"] > 0 and not [k for k in figures if "compiled" in k]
    with pytest.raises(RuntimeError, match="the compiled trial went on eager"):
        trial_seconds(rounds=2, clients=4)


SMOKE_SPEED = dict(dataset="digits", partition="dir:0.3", clients=4, batch_size=40, backbone="mlp")


def test_a_compiled_figure_whose_timed_rounds_compiled_is_refused(monkeypatch):
    """FedAvg's 7.085 and FedCP's 13.08 s a round were once written as compiled although their timed rounds
    compiled programs: such a run gives the reason and no compiled time."""
    load_campaign()
    import bench.engine_speed as engine_speed

    timed = engine_speed.seconds_per_round

    def recompiling(sim, rounds):
        warm, per_round, _ = timed(sim, rounds)
        return warm, per_round, 2 if sim.executor.settings.engine == "compiled" else 0

    monkeypatch.setattr(engine_speed, "seconds_per_round", recompiling)
    figures: dict = {}
    with pytest.raises(engine_speed.NotCompiled, match="compiled 2 programs during its timed rounds"):
        engine_speed.measure("fedavg", "cpu", rounds=1, out=figures, **SMOKE_SPEED)
    assert "compiled s/round" not in figures and figures["eager s/round"] > 0
    # the same run with its timed rounds compiling nothing gives its figure
    monkeypatch.setattr(engine_speed, "seconds_per_round", timed)
    assert engine_speed.measure("fedavg", "cpu", rounds=1, **SMOKE_SPEED)["compiled s/round"] > 0


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

    args = type(
        "Args",
        (),
        {
            "out": str(tmp_path),
            "device": "cpu",
            "data": None,
            "budget_min": 1.0,
            "smoke": True,
            "stages": "speed,environment",
            "methods": None,
            "engine": "eager",
            "columns": "fedpac-20",
        },
    )()
    c = campaign.Campaign(args)
    c.stage("speed", lambda deadline: 1 / 0)
    c.stage("environment", c.environment)
    results = json.loads((tmp_path / "campaign.json").read_text())
    assert "ZeroDivisionError" in results["speed"]["error"] and results["environment"]["device"] == "cpu"
    assert "| speed | ZeroDivisionError" in (tmp_path / "summary.md").read_text()


def test_the_busy_share_counts_overlapping_device_spans_once():
    """A CPU op's device time repeats its kernels' and an annotation spans them: the busy time is the union of the
    device's spans (the first H200 profile summed every event's device time and said 163 %)."""
    load_campaign()  # puts the checkout on the path, for bench's modules
    from bench.campaign.speed import busy_seconds

    assert busy_seconds([(5, 6), (0, 2), (1, 3), (1.5, 2.5)]) == 4
    assert busy_seconds([]) == 0


def test_a_method_whose_measurement_breaks_keeps_the_figures_measured_before(monkeypatch):
    """The first H200 check lost GPFL's figures to an error in the last one measured (the chain bound)."""
    load_campaign()
    import bench.engine_speed as engine_speed
    from bench.campaign.speed import speed

    monkeypatch.setattr(engine_speed, "chain_bound_seconds", lambda sim: 1 / 0)
    args = type("Args", (), {"smoke": True})()
    written: list[dict] = []
    result = speed(
        type("Campaign", (), {"args": args, "device": "cpu", "progress": lambda _, r: written.append(r)})(),
        deadline=float("inf"),
    )
    fedavg = result["figures"]["fedavg"]
    assert fedavg["error"].startswith("ZeroDivisionError") and fedavg["compiled s/round"] > 0 and "programs" in fedavg
    assert "fedavg: ZeroDivisionError" in result["line"] and written == [result]  # written as the method ended


def test_a_time_limit_inside_a_method_keeps_the_figures_it_reached(monkeypatch):
    """An H100 check was stopped by its command's limit (SIGINT) while FedCP compiled, and the speed stage, which
    wrote its figures only when it ended, lost GPFL's, FedAvg's and FedPAC's."""
    load_campaign()
    import bench.campaign.speed as stage

    def measure(method, device, rounds, out, **settings):
        out["eager s/round"] = {"fedavg": 2.0, "gpfl": 6.0}[method]
        if method == "gpfl":
            raise KeyboardInterrupt
        out |= {
            "compiled s/round": 0.5,
            "compile + first round s": 9.0,
            "second trial: compile + first round s": 0.4,
            "second trial programs": 0,
            "graph calls": 3,
            "graph skips": 0,
        }

    monkeypatch.setattr(stage, "measure", measure)
    args = type("Args", (), {"smoke": False, "speed_methods": ["fedavg", "gpfl"]})()
    written: list[dict] = []
    campaign = type(
        "Campaign",
        (),
        {
            "args": args,
            "device": "cpu",
            "data": None,
            "progress": lambda _, r: written.append(json.loads(json.dumps(r))),
        },
    )()
    with pytest.raises(KeyboardInterrupt):
        stage.speed(campaign, deadline=float("inf"))
    assert [sorted(w["figures"]) for w in written] == [["fedavg"], ["fedavg", "gpfl"]]
    assert written[-1]["figures"]["gpfl"] == {"eager s/round": 6.0}
    assert (
        written[-1]["line"].startswith("fedavg 2 -> 0.5 s/round")
        and "gpfl: stopped before its figures were complete" in written[-1]["line"]
    )


def test_every_json_under_results_gpu_says_its_device_torch_and_commit_and_whether_the_tree_was_clean(tmp_path):
    """A figure from a GPU is only as good as where it came from: each file's environment (the campaign's block, or
    a bench's provenance at the top) names the device, torch and the commit, "+changes" marking a checkout that
    differed from it; a file whose tree state was not recorded says so."""
    files = sorted((ROOT / "results/gpu").rglob("*.json"))
    assert len(files) >= 16
    for path in files:
        record = json.loads(path.read_text())
        # a run folder's environment.json lists where each command of the run trained
        for env in record if isinstance(record, list) else [record.get("environment", record)]:
            device = env.get("name") or env.get("machine") or env.get("device")
            assert device and (device.startswith("NVIDIA") or device.startswith("CPU")), path
            assert re.fullmatch(r"\d+\.\d+\.\d+(\+\w+)?", env["torch"]), path
            assert re.fullmatch(r"[0-9a-f]{7}(\+changes)?", env["commit"]), path
    # a command that runs no environment stage still writes it (the 7a0cf86 correctness files had none)
    campaign = load_campaign()
    args = type("Args", (), {"out": str(tmp_path), "device": "cpu", "data": None, "budget_min": 1.0, "smoke": True})()
    args.stages = "speed"
    campaign.Campaign(args).write()
    env = json.loads((tmp_path / "campaign.json").read_text())["environment"]
    assert env["name"].startswith("CPU") and env["torch"] == torch.__version__ and env["commit"]


def test_a_columns_run_compiles_on_cuda_only_what_was_checked_there_on_its_backbone():
    """The real run asks for the compiled engine where the pair is committed as checked or passed this folder's
    compiled check; a failed or eager check, or another backbone's, leaves it to `auto` (eager on CUDA)."""
    load_campaign()
    from bench.campaign.real_run import checked_on_cuda

    checks = {
        "compiled: gpfl on cnn4": {"status": "passed", "method": "gpfl", "backbone": "cnn4"},
        "compiled: fedcp on cnn4": {"status": "failed", "method": "fedcp", "backbone": "cnn4"},
        "executors equal: fedavg on cnn4": {"status": "passed", "method": "fedavg", "backbone": "cnn4"},
    }
    pairs = checked_on_cuda(checks)
    assert ("gpfl", "cnn4") in pairs and ("gpfl", "mlp") in pairs  # this folder's, and the committed ones
    assert not {("fedcp", "cnn4"), ("fedavg", "cnn4"), ("gpfl", "resnet18")} & pairs


def test_a_correctness_check_on_cnn4_runs_the_papers_cnn_on_small_fashion_mnist_clients():
    campaign = load_campaign()
    args = type("Args", (), {"smoke": False, "data": None, "backbone": None})()
    c = type("C", (), {"args": args, "data": None, "digits": campaign.Campaign.digits})()
    cfg = campaign.Campaign.checked(c, "gpfl", campaign.check_backbone(args), engine="compiled")
    assert (cfg.backbone, cfg.dataset, cfg.partition, cfg.pac_train, cfg.dtype) == (
        "cnn4",
        "fmnist",
        "pac:20",
        60,
        "float64",
    )
    assert campaign.check_backbone(type("Args", (), {"smoke": True, "backbone": None})()) == "mlp"
    result = campaign.executors_equal(replace(cfg, engine="eager", clients=4), "cpu", rounds=1)
    assert result["max_abs_difference"] < 1e-9


def test_the_gpu_checks_default_stages_fit_its_default_budget_as_measured_on_an_h200():
    """The first default check could not finish inside its 8 minutes (the speed stage alone took 391 s): each default
    stage's share of the default budget now covers what it took on an H200, with a tenth to spare."""
    load_campaign()
    from bench.gpu_check import BUDGET_MIN, DEFAULT_STAGES, SHARES

    gpu = ROOT / "results/gpu"
    speed = json.loads((gpu / "check-h200-7a0cf86/speed/campaign.json").read_text())
    measured = {stage: speed[stage]["seconds"] for stage in ("environment", "speed", "profile")}
    check = json.loads((gpu / "check-h200-a50e3b0/campaign.json").read_text())
    measured["correctness"] = check["correctness"]["seconds"]
    assert set(DEFAULT_STAGES) == set(measured) and measured["speed"] > 0.45 * 8 * 60  # the old shares' shortfall
    total = sum(SHARES[s] for s in DEFAULT_STAGES)
    for stage in DEFAULT_STAGES:
        assert SHARES[stage] / total * BUDGET_MIN * 60 >= 1.1 * measured[stage], stage
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert (
        f"in one command of at most {BUDGET_MIN:.0f} minutes (`--budget-min`; its four default stages took "
        f"{sum(measured.values()):.0f} s on an H200"
    ) in performance


def test_a_column_run_starts_the_measured_cheapest_first_and_none_that_cannot_finish_in_the_time_left(
    tmp_path, monkeypatch
):
    """A run's cost is the first round and the rest at its method's measured pace, from the column's runs on this
    device; one that cannot finish before the stage's deadline is not started, one not yet measured is."""
    load_campaign()
    import bench.campaign.real_run as stage
    from bench.campaign.summary import summary_markdown

    committed, out = tmp_path / "committed", tmp_path / "out"
    for method, first, later in (("fedavg", 5.0, 1.0), ("local", 3.0, 0.1)):  # seed 0 done, on this device
        folder = committed / "fedpac-20" / f"{method}-seed0"
        folder.mkdir(parents=True)
        rows = {"round": range(1, 101), "time_s": [first] + [later] * 99, "acc": [0.5] * 100}
        pd.DataFrame(rows).to_parquet(folder / "metrics.parquet")
        (folder / "environment.json").write_text(json.dumps([{"device": "GPU X", "torch": "2", "commit": "abc"}]))
    plan = [
        stage.Planned("fedpac-20", m, seed, [m, "--rounds", "100"], 100)
        for m in ("pfedhn", "fedavg", "local")
        for seed in (0, 1)
    ]
    monkeypatch.setattr(stage, "planned_runs", lambda campaign: plan)
    started = []
    monkeypatch.setattr(stage, "tuner_run", lambda args, campaign: started.append(args[0]))  # None: "finished"
    monkeypatch.setattr(stage, "pack", lambda runs, archive: [])
    campaign = type(
        "Campaign",
        (),
        {
            "out": out,
            "knee": 1,
            "environment_name": "GPU X",
            "args": type("Args", (), {"committed": str(committed), "columns": "fedpac-20", "seeds": 2})(),
        },
    )()
    # local-seed1: 3 + 99 x 0.1 = 12.9 s fits 60 s; fedavg-seed1: 5 + 99 x 1 = 104 s does not; pfedhn unmeasured
    result = stage.real_run(campaign, deadline=time.monotonic() + 60)
    assert started == ["local", "pfedhn", "pfedhn"]
    runs = result["runs"]
    fedavg = runs["fedpac-20/fedavg-seed1"]
    assert not fedavg["finished"] and fedavg["rounds"] == 0 and fedavg["left"] == "not started: needs ~104 s"
    assert "| not started: needs ~104 s |" in summary_markdown({"real run": {**result, "seconds": 1.0}})
    assert runs["fedpac-20/local-seed0"]["where"] == str(committed) and runs["fedpac-20/fedavg-seed0"]["finished"]
    # measured on another device, the pace is not this one's: both unmeasured, both started
    started.clear()
    campaign.environment_name = "GPU Y"
    stage.real_run(campaign, deadline=time.monotonic() + 60)
    assert sorted(started) == ["fedavg", "local", "pfedhn", "pfedhn"]


def test_with_no_run_going_the_real_run_waits_for_nothing():
    """A column whose remaining runs were all finished earlier or could not fit waited out the rest of its budget:
    waiting on no process returns at once (a guard far above that: a minute's limit; the old wait took the two)."""
    load_campaign()
    from bench.campaign.processes import wait_any

    t0 = time.monotonic()
    assert wait_any([], deadline=t0 + 120) == [] and time.monotonic() - t0 < 60
