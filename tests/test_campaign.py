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
from tuner.compile import INDUCTOR_CONFIGS
from tuner.config import RunConfig

INDUCTOR_DEFAULT = INDUCTOR_CONFIGS[0][0]

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


def test_the_pages_quote_the_h100_speed_stage_as_committed():
    """docs/performance.md's and README.md's FedCP, FedPAC and profile figures, from the committed campaign.json."""
    run = json.loads((ROOT / "results/gpu/speed-h100-ea133d7/campaign.json").read_text())
    flat = lambda page: " ".join((ROOT / page).read_text().split())  # noqa: E731
    fedcp, fedpac, prof = run["speed"]["figures"]["fedcp"], run["speed"]["figures"]["fedpac"], run["profile"]
    assert run["environment"]["name"] == "NVIDIA H100 80GB HBM3" and run["environment"]["commit"] == "ea133d7"
    assert fedcp["compile retries"] == 1 and fedcp["whole round recompiles"] == 0 and fedpac["compile retries"] == 0
    performance = flat("docs/performance.md")
    for phrase in [
        f"FedCP, Table 1 training: {fedcp['eager s/round']:.2f} s a round eager; compiled, a whole round with "
        "every client's evaluation "
        f"{fedcp['compiled whole round s']:.3f} s; {fedcp['compile + first round s']:.0f} s compiling the "
        f"first round ({fedcp['programs']} programs",
        f"a second trial {fedcp['second trial programs']} programs, its first round "
        f"{fedcp['second trial: compile + first round s']:.2f} s; "
        f"the chain bound {fedcp['chain bound s']:.3f} s",
        f"Its training-only figure ({fedcp['compiled s/round']:.2f} s) counts {fedcp['recompiles']} programs "
        "compiled during its timed rounds",
        f"{fedpac['eager s/round']:.3f} s a round eager against {fedpac['compiled s/round']:.3f} compiled "
        f"({fedpac['eager / compiled']:.1f}×), "
        f"{fedpac['compiled whole round s']:.3f} with evaluation; {fedpac['compile + first round s']:.0f} s "
        "compiling the first round "
        f"({fedpac['programs']} programs, under the default configuration); a second trial "
        f"{fedpac['second trial programs']} programs",
        f"{fedpac['% of chain bound']:.0f} % of its chain bound ({fedpac['chain bound s']:.3f} s)",
        f"20 compiled steps in {prof['wall_s']:.3f} s, every one a CUDA graph ({prof['graph calls']} graph "
        f"calls with the 20 steps before them that compiled, {prof['graph skips']} skipped), "
        f"and the GPU busy {100 * prof['device_busy_share']:.0f} % of that time",
    ]:
        assert phrase in performance, phrase
    assert (
        f"On an H100 FedPAC's Table 1 round ran in {fedpac['compiled s/round']:.3f} s compiled against "
        f"{fedpac['eager s/round']:.3f} eager, "
        f"and FedCP's whole round with evaluation in {fedcp['compiled whole round s']:.2f} s against "
        f"{fedcp['eager s/round']:.2f} eager"
    ) in flat("README.md")


def test_the_performance_page_quotes_the_h200_compile_diagnostics_as_committed():
    """FedAvg's second trial compiled its default-configuration shapes again (dynamo's backend guard), and pFedMe's
    compile fails in Triton: what docs/performance.md says of them, from the committed logs and figures."""
    folder = ROOT / "results/gpu/h200-9f08411"
    fedavg = json.loads((folder / "fedavg-speed.json").read_text())
    figures = fedavg["figures"]["fedavg"]
    assert (fedavg["commit"], fedavg["machine"], fedavg["torch"]) == (
        "9f08411",
        "NVIDIA H200, 16 CPU cores",
        "2.11.0+cu130",
    )
    assert figures["recompiles"] == 0 and figures["compile retries"] == 1 and figures["second trial programs"] == 2
    log = (folder / "fedavg-speed.log").read_text()
    # each recompile of tuner/steps.py's step (frame 0), once, with the size that caused it
    sizes = list(
        dict(
            re.findall(
                r"\[0/(\d+)\] \[__recompiles\] +- 0/\d+: tensor 'x' size mismatch at index 0\. expected \d+, "
                r"actual (\d+)",
                log,
            )
        ).values()
    )
    assert sizes == [
        "16",
        "8",
        "8",
        "4",
        "2",
        "1",
        "20",
        "16",
    ]  # 8 once a configuration; then the second trial's 20 and 16
    assert log.count("BACKEND_MATCH failure") == 2
    pfedme = (folder / "pfedme.log").read_text()
    assert "NameError('in_ptr8 is not defined')" in pfedme and "in_ptr7, in_ptr9," in pfedme
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    for phrase in [
        "FedAvg's timed rounds compiled nothing (its padded sizes 20 and 16 under the default configuration, "
        "8 failed, and 8, 4, 2, 1 under the second)",
        f"But a second trial in the same process compiled 20 and 16 again ({figures['second trial programs']} "
        "programs)",
        "`NameError('in_ptr8 is not defined')`",
    ]:
        assert phrase in performance, phrase


def test_the_pages_quote_the_h200_check_as_committed():
    """README.md and docs/performance.md's figures of the GPU check, from its committed campaign.json."""
    check = json.loads((ROOT / "results/gpu/check-h200-a50e3b0/campaign.json").read_text())
    flat = lambda page: " ".join((ROOT / page).read_text().split())  # noqa: E731
    checks, speed, prof = check["correctness"]["checks"], check["speed"]["figures"], check["profile"]
    gpfl, fedavg = speed["gpfl"], speed["fedavg"]
    passed = [c for c in checks.values() if c["status"] == "passed"]
    assert check["environment"]["name"] == "NVIDIA H200" and check["environment"]["torch"] == "2.11.0+cu130"
    assert (
        check["correctness"]["failed"] == ["compiled: pfedme"]
        and "SubprocException" in checks["compiled: pfedme"]["message"]
    )
    assert [n for n, c in checks.items() if c.get("inductor") == INDUCTOR_DEFAULT] == ["compiled: gpfl"]
    largest = max(c["max_abs_difference"] for c in passed)
    performance = flat("docs/performance.md")
    for phrase in [
        f"Correctness: {len(passed)} of {len(checks)} families compiled on the GPU equal sequential eager on "
        f"the CPU in float64 (largest difference {largest:.1e})",
        f"every compiled step a CUDA graph ({sum(c['graph calls'] for c in passed)} graph calls, "
        f"{sum(c['graph skips'] for c in passed)} skipped)",
        f"{gpfl['eager s/round']:.2f} s a round eager, {gpfl['compiled s/round']:.3f} compiled "
        f"({gpfl['eager / compiled']:.1f}×), "
        f"{gpfl['compiled whole round s']:.3f} with every client's evaluation; "
        f"{gpfl['compile + first round s']:.0f} s compiling the first round "
        f"({gpfl['programs']} programs); a second trial {gpfl['second trial programs']} programs, its first "
        f"round {gpfl['second trial: compile + first round s']:.2f} s",
        f"is {gpfl['% of chain bound']:.0f} % of the chain bound ({gpfl['chain bound s']:.3f} s",
        f"FedAvg: {fedavg['eager s/round']:.2f} s eager; its compiled training-only figure "
        f"({fedavg['compiled s/round']:.2f} s) counts "
        f"{fedavg['recompiles']} programs compiled during its timed rounds",
        f"compiled, {fedavg['compiled whole round s']:.3f} s, against a ceiling of {fedavg['ceiling s/round']:.3f} s",
        f"20 compiled steps of GPFL's cohort in {prof['wall_s']:.3f} s ({1000 * prof['wall_s'] / 20:.1f} ms a step)",
        f"(the implicit GEMM forward, {prof['top'][1]['calls']} calls, {prof['top'][1]['ms']:.1f} ms",
        f"with {sum(k['calls'] for k in prof['top'] if 'Nhwc' in k['name'] or 'nhwc' in k['name'])} layout transposes",
        f"the profile's busy share ({100 * prof['device_busy_share']:.0f} %)",
    ]:
        assert phrase in performance, phrase
    assert (
        f"On an H200 the compiled engine ran GPFL's Table 1 round in {gpfl['compiled s/round']:.3f} s against "
        f"{gpfl['eager s/round']:.2f} eager, "
        f"every step a CUDA graph, and {len(passed)} of {len(checks)} families of methods equal to the CPU "
        "reference in float64 (pFedMe fails "
        "to compile there and runs eager); 2000 training rounds still take about "
        f"{round(2000 * gpfl['compiled s/round'] / 60)} minutes"
    ) in flat("README.md")


def test_the_performance_page_quotes_the_h100_check_as_committed():
    """The H100 check's correctness stage and FedAvg's figures (the retry's kept programs and SHAPES_NEEDED on a GPU),
    as docs/performance.md quotes them, from the committed campaign.json files."""
    folder = ROOT / "results/gpu/check-h100-7b36476"
    check = json.loads((folder / "correctness/campaign.json").read_text())
    run = json.loads((folder / "fedavg/campaign.json").read_text())
    checks, fedavg = check["correctness"]["checks"], run["speed"]["figures"]["fedavg"]
    passed = [c for c in checks.values() if c["status"] == "passed"]
    for env in (check["environment"], run["environment"]):
        assert env["name"] == "NVIDIA H100 80GB HBM3" and env["torch"] == "2.11.0+cu130"
    assert "speed" not in check and check["correctness"]["failed"] == ["compiled: pfedme"]
    assert [n for n, c in checks.items() if c.get("inductor") == INDUCTOR_DEFAULT] == ["compiled: gpfl"]
    assert fedavg["recompiles"] == 0 and fedavg["second trial programs"] == 0 and fedavg["compile retries"] == 1
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    for phrase in [
        f"{len(passed)} of {len(checks)} families compiled on the GPU equal sequential eager on the CPU in "
        "float64 (largest "
        f"difference {max(c['max_abs_difference'] for c in passed):.1e}), every compiled step a CUDA graph "
        f"({sum(c['graph calls'] for c in passed)} graph calls, {sum(c['graph skips'] for c in passed)} "
        f"skipped), in {check['correctness']['seconds']:.0f} s",
        f"FedAvg alone, at commit 7b36476: {fedavg['eager s/round']:.2f} s a round eager, "
        f"{fedavg['compiled s/round']:.3f} compiled "
        f"({fedavg['eager / compiled']:.1f}×), {fedavg['compiled whole round s']:.3f} with every client's evaluation; "
        f"{fedavg['compile + first round s']:.0f} s compiling the first round ({fedavg['programs']} programs",
        f"{fedavg['recompiles']} programs compiled during its timed rounds and a second trial "
        f"{fedavg['second trial programs']} programs, "
        f"its first round {fedavg['second trial: compile + first round s']:.2f} s",
        f"{fedavg['% of chain bound']:.0f} % of its chain bound ({fedavg['chain bound s']:.3f} s) and "
        f"{fedavg['% of ceiling']:.0f} % of its "
        f"ceiling ({fedavg['ceiling s/round']:.3f} s)",
    ]:
        assert phrase in performance, phrase
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"FedAvg's training round in {fedavg['compiled s/round']:.3f} s against {fedavg['eager s/round']:.2f} "
        "eager, its second trial "
        "compiling nothing"
    ) in readme


def test_the_methods_auto_compiles_on_cuda_are_those_the_committed_checks_passed():
    """`auto`'s CUDA table (tuner/compile.py CUDA_CHECKED) is what the GPU checks under results/gpu measured, a
    (method, backbone) pair each: every pair whose compiled check passed (all compiled, every step a CUDA graph),
    none whose compiled check failed; a family that failed is named with its reason (CUDA_FAILS)."""
    from tuner.compile import CUDA_CHECKED, CUDA_FAILS

    passed, failed = set(), set()
    for path in (ROOT / "results/gpu").glob("check-*/**/campaign*.json"):
        for name, check in json.loads(path.read_text()).get("correctness", {}).get("checks", {}).items():
            if "compiled" not in name:
                continue
            pair = checked_pair(name, check)
            if check["status"] == "passed":
                assert check["graph skips"] == 0 and check["graph calls"] > 0, (path, name)
                passed.add(pair)
            elif check["status"] == "failed":
                failed.add(pair)
    assert failed == {("pfedme", "mlp"), ("feddyn", "mlp")} and not failed & passed
    assert CUDA_CHECKED == passed and set(CUDA_FAILS) == {m for m, _ in failed}


def checked_pair(name: str, check: dict) -> tuple[str, str]:
    """(method, backbone) of a correctness check: recorded in it since the checks took a backbone; before, the
    method ends its name ("compiled: m", "... (fedper)") and the backbone was digits' MLP but for ResNet-18's case."""
    if "method" in check:
        return check["method"], check["backbone"]
    method = re.sub(r".*\((\w[\w-]*)\)$", r"\1", name).split(": ")[-1]
    return method, "resnet18" if "ResNet-18" in name else "mlp"


def test_the_performance_page_quotes_the_h200_check_at_7a0cf86_as_committed():
    folder = ROOT / "results/gpu/check-h200-7a0cf86"
    run = json.loads((folder / "speed/campaign.json").read_text())
    assert run["environment"]["name"] == "NVIDIA H200" and run["environment"]["commit"] == "7a0cf86"
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    names = {"gpfl": "GPFL", "fedavg": "FedAvg", "fedpac": "FedPAC", "fedcp": "FedCP"}
    for method, f in run["speed"]["figures"].items():
        assert f["recompiles"] == f["graph skips"] == 0
        row = (
            f"| {names[method]} | {f['eager s/round']:.3g} | {f['compiled s/round']:.3f} | "
            f"{f['compiled whole round s']:.3f} | {f['compile + first round s']:.0f} s | "
            f"{f['second trial programs']} | {f['% of chain bound']:.0f} |"
        )
        assert row in performance, row
    prof = run["profile"]
    assert (
        f"20 compiled steps of GPFL's cohort in {prof['steps_s']:.3f} s timed by CUDA events with no profiler running "
        f"({1e3 * prof['steps_s'] / 20:.1f} ms a step), {prof['window_s']:.3f} s inside the profiler's timed window, "
        f"the GPU busy {100 * prof['device_busy_share']:.0f} % of that window"
    ) in performance
    assert prof["top"][0]["name"].startswith("void implicit_convolve_sgemm") and prof["top"][0]["calls"] == 400
    checks = {}
    for path in sorted((folder / "correctness").glob("campaign-*.json")):
        checks |= json.loads(path.read_text())["correctness"]["checks"]
    passed = {n: c for n, c in checks.items() if c["status"] == "passed"}
    failed = [n for n, c in checks.items() if c["status"] == "failed"]
    assert len(passed) == 11 and failed == ["executors equal (compiled): feddyn"]
    largest = max(c["max_abs_difference"] for c in passed.values())
    assert f"(largest difference {largest:.1e})" in performance
    assert "after 12 of 72" in performance and len(passed) + len(failed) == 12
    readme = " ".join((ROOT / "README.md").read_text().split())
    f = run["speed"]["figures"]
    assert (
        f"At commit 7a0cf86 on an H200, from an empty compile cache: GPFL {f['gpfl']['compiled s/round']:.3f} s a "
        f"round, FedAvg {f['fedavg']['compiled s/round']:.3f}, FedCP {f['fedcp']['compiled s/round']:.3f} and "
        f"FedPAC {f['fedpac']['compiled s/round']:.3f}"
    ) in readme
    from tuner.compile import CUDA_CHECKED

    on_mlp = [m for m, backbone in CUDA_CHECKED if backbone == "mlp"]
    assert f"{len(on_mlp)} methods are checked to compile on CUDA equal to the CPU reference on the MLP" in readme


def test_the_performance_page_quotes_the_block_and_convolution_benches_as_committed():
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    blocks = json.loads((ROOT / "results/bench/step-blocks-digits.json").read_text())
    assert blocks["machine"].startswith("CPU") and f"commit {blocks['commit']}, 30 rounds each" in performance
    for label, f in blocks["figures"]["digits"].items():
        row = (
            f"| {label[2:]} | {f['compile s']:.1f} | {f['s/round']:.3f} | {f['host us/step']:.0f} | "
            f"{f['host / K=1']:.2f} | {f['in the call us/step']:.0f} |"
        )
        assert row in performance, row
    table1 = json.loads((ROOT / "results/bench/step-blocks-table1.json").read_text())
    assert f"`python bench/step_blocks.py --settings table1 --rounds 2`, commit {table1['commit']}" in performance
    for label, f in table1["figures"]["table1"].items():
        row = (
            f"| {label[2:]} | {f['compile s']:.1f} | {f['s/round']:.3f} | {f['host us/step']:.0f} | "
            f"{f['host / K=1']:.2f} | {f['in the call us/step']:.0f} |"
        )
        assert row in performance, row
    t = table1["figures"]["table1"]
    growth = [t[k]["compile s"] / t["K=1"]["compile s"] for k in ("K=4", "K=16")]
    assert f"compiling grows {growth[0]:.1f}× at K = 4 and {growth[1]:.1f}× at K = 16" in performance
    k16 = blocks["figures"]["digits"]["K=16"]
    assert f"cuts the host's time a step by {1 / k16['host / K=1']:.1f}×" in performance and k16["host / K=1"] <= 0.25
    assert f"{k16['s/round / K=1']:.2f}× slower at K = 16" in performance
    forms = json.loads((ROOT / "results/bench/conv-forms-cpu.json").read_text())["figures"]["forms"]
    grouped, unfold, last = forms["grouped"], forms["unfold"], forms["channels_last"]
    assert (
        f"grouped convolution {grouped['eager ms/step']:.1f} ms a step eager and {grouped['compiled ms/step']:.1f} "
        f"compiled; `unfold` {unfold['eager / grouped']:.2f}× and {unfold['compiled / grouped']:.2f}× that; "
        f"a `channels_last` form, since removed, {last['eager / grouped']:.2f}× and {last['compiled / grouped']:.2f}×"
    ) in performance


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
