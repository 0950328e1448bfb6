"""`tuner sweep` end to end on Ray: trials, checkpoints, seeds, failures, resume after SIGKILL, placement."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app
from tuner.config import resolve_layers
from tuner.report.intervals import difference
from tuner.selection import SCORE, score, selection, trial_score
from tuner.sweep.cluster import OWN_RAY_CONFIG
from tuner.sweep.schedulers import asha
from tuner.sweep.stopping import Patience, RoundBudget
from tuner.sweep.storage import PARTIAL

ROOT = Path(__file__).resolve().parents[1]
TINY = """
settings: {dataset: digits, partition: iid, clients: 4, rounds: 3, checkpoint_every: 2, executor: sequential,
batch_size: 40}
search:
  lr: {loguniform: [0.001, 0.2]}
samples: 3
"""


def _trial(d: Path) -> dict:
    rows = [json.loads(line) for line in (d / "result.json").read_text().splitlines() if line.strip()]
    return {"dir": d, "params": json.loads((d / "params.json").read_text()), "rows": rows}


def trials(experiment: Path) -> list[dict]:
    """Every trial of a finished Ray Tune experiment: its sampled config and its reported rows."""
    return [_trial(d) for d in sorted(p for p in experiment.iterdir() if (p / "params.json").exists())]


def trials_so_far(experiment: Path) -> list[dict]:
    """The trials of a running experiment whose files are whole: Tune may be writing one as it is read
    (seen: an empty params.json), and that trial is seen whole at the next poll."""
    out = []
    for d in sorted(p for p in experiment.iterdir() if (p / "params.json").exists()) if experiment.exists() else []:
        try:
            out.append(_trial(d))
        except (json.JSONDecodeError, FileNotFoundError):  # a trial begun has no result.json yet
            continue
    return out


def checkpointed_states(trial_dir: Path) -> list[list[dict]]:
    """The rounds each of a trial's checkpointed states went through (round, trial, ran_at, searched values), oldest
    checkpoint first; one a kill cut mid-copy is left out. Ray Tune's result.json cannot count the rounds a trial
    trained across a kill: restarting a trial, Tune copies the storage's copy over the one it writes, and rows
    reported since the last copy are gone (`_restore_from_remote`, ray/tune/logger/logger.py)."""
    from tuner.schedule import ROUNDS_FILE, read_rounds

    states = []
    for rounds in sorted(trial_dir.glob(f"checkpoint_*/{ROUNDS_FILE}")):
        try:
            states.append(read_rounds(rounds)[0])
        except (OSError, ValueError):
            continue
    return states


def recorded_checkpoints(experiment: Path) -> dict[Path, int]:
    """Each trial's latest checkpointed round that Ray Tune's saved experiment state records: what --resume restores
    it from. A trial writes its checkpoint, then Tune records it and saves its state every TUNE_GLOBAL_CHECKPOINT_S;
    a kill in between restores the one before (seen: a kill 0.4 s after a first checkpoint ran the trial again from
    round 1). Empty while the state is being written (a partial file)."""
    from ray import cloudpickle

    states = sorted(experiment.glob("experiment_state-*.json")) if experiment.exists() else []
    try:
        saved = json.loads(states[-1].read_text())["trial_data"] if states else []
    except (json.JSONDecodeError, KeyError):
        return {}
    recorded = {}
    for trial, runtime in saved:
        manager = json.loads(runtime)["checkpoint_manager"]["value"]
        latest = cloudpickle.loads(bytes.fromhex(manager)).latest_checkpoint_result
        if latest is not None:
            trial_id = json.loads(trial)["trial_id"]
            recorded[next(d for d in experiment.glob(f"*_{trial_id}*") if d.is_dir())] = latest.metrics["round"]
    return recorded


def fresh_accuracies(base: dict, params: dict) -> list[float]:
    """A trial's per-round accuracies, run here in this process on one thread as its worker runs it."""
    import torch

    from tuner.run import build_simulation
    from tuner.sweep.trials import trial_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = trial_config(base, params)
        sim = build_simulation(cfg)
        return [sim.step()["acc"] for _ in range(cfg.rounds)]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ray_local():
    """Ray for this module's sweeps, one trial at a time: a stage's trials share one worker (reuse_actors), which
    starts and imports torch once (~5 s of CPU a worker), while the suite's other xdist worker keeps the second core.
    Configured as a sweep starts its own (tuner/sweep/cluster.py)."""
    import ray

    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        _system_config=OWN_RAY_CONFIG,
    )
    yield
    ray.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_searches_checkpoints_and_reruns_the_best_with_seeds(tmp_path, ray_local):
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY)
    study_db = tmp_path / "study.db"
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            "fedavg",
            "--space",
            str(space),
            "--storage",
            str(tmp_path),
            "--seeds",
            "2",
            "--study-db",
            str(study_db),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "best configuration" in res.output and "2 fresh seeds" in res.output and "chosen by" in res.output
    search = trials(tmp_path / "fedavg-tiny" / "search")
    assert len(search) == 3
    assert {"lr": 0.005} in [t["params"] for t in search]  # the MLP's paper learning rate is tried
    for t in search:
        assert [r["round"] for r in t["rows"]] == [1, 2, 3]
        best = [r["best_acc"] for r in t["rows"]]
        assert best == sorted(best) and best[-1] == max(r["acc"] for r in t["rows"])
        assert list(t["dir"].glob("checkpoint_*/simulation.pt"))
    experiment = yaml.safe_load((tmp_path / "fedavg-tiny" / "search" / "experiment.yaml").read_text())
    # Trials reuse their worker process, and a trial run in a used worker equals a fresh run of its config.
    by_start = sorted(search, key=lambda t: t["rows"][0]["reported_at"] - t["rows"][0]["time_total_s"])
    reused = [t for i, t in enumerate(by_start) if t["rows"][0]["pid"] in {u["rows"][0]["pid"] for u in by_start[:i]}]
    assert reused, [t["rows"][0]["pid"] for t in by_start]
    assert [r["acc"] for r in reused[0]["rows"]] == fresh_accuracies(experiment["settings"], reused[0]["params"])
    assert experiment["stage"] == "search" and experiment["settings"]["method"] == "fedavg"
    summary = yaml.safe_load((tmp_path / "fedavg-tiny" / "summary.yaml").read_text())
    best_lr = summary["best_config"]["lr"]
    # One trial is best by validation (the earlier round of equals) for the console, Optuna's study and the report.
    by_rule = max(search, key=lambda t: (t["rows"][-1]["best_val_acc"], -t["rows"][-1]["best_val_round"]))
    assert by_rule["params"]["lr"] == best_lr and summary["best"]["best_val_acc"] == by_rule["rows"][-1]["best_val_acc"]
    study = optuna.load_study(study_name="fedavg-tiny", storage=f"sqlite:///{study_db}")
    assert study.best_trial.params["lr"] == best_lr
    assert (
        CliRunner().invoke(app, ["report", str(tmp_path / "fedavg-tiny"), "--out", str(tmp_path / "r")]).exit_code == 0
    )
    best = pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]
    assert best["config"] == f"lr={best_lr:.4g}" and best["val_acc"] == summary["best"]["best_val_acc"]
    seeds = trials(tmp_path / "fedavg-tiny" / "seeds")
    assert sorted(t["params"]["seed"] for t in seeds) == [1, 2]
    assert all(t["params"]["lr"] == best_lr and t["rows"][-1]["round"] == 3 for t in seeds)
    assert seeds[0]["rows"][-1]["acc"] != seeds[1]["rows"][-1]["acc"]  # the seeds really differ
    again = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path)])
    assert again.exit_code == 2 and "already holds a sweep; pass --resume" in again.output
    # Ray Tune wrote the sweep's folder in whole files (tuner/sweep/storage.py), none left partial
    assert b"WholeFiles" in (tmp_path / "fedavg-tiny" / "search" / "tuner.pkl").read_bytes()
    assert not list(tmp_path.rglob(f"*{PARTIAL}*"))


@pytest.mark.ray
@pytest.mark.slow
def test_tied_trials_name_the_trial_that_started_first_in_the_console_summary_and_report(tmp_path, ray_local):
    """checkpoint_every changes no figure, so three trials tie on score; every place that names a best trial names
    the one that started first, whatever order the grid sampler drew the values in."""
    space = tmp_path / "tie.yaml"
    space.write_text(
        "settings: {dataset: digits, partition: iid, clients: 4, rounds: 2, executor: sequential}\n"
        "search:\n  checkpoint_every: {grid: [1, 2, 3]}\nsampler: grid\nsamples: 3\nselect: val\n"
    )
    res = CliRunner().invoke(
        app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), "--max-concurrent", "1"]
    )
    assert res.exit_code == 0, res.output
    search = trials(tmp_path / "fedavg-tie" / "search")
    assert len({t["rows"][-1]["score"] for t in search}) == 1  # a tie for ASHA, Optuna's study and the console alike
    # Tune starts trials in the order it creates them, and each folder begins with that count (one trial at a time).
    first = next(t for t in search if t["dir"].name.startswith("federated_trial_00001_"))["params"]["checkpoint_every"]
    assert f"checkpoint_every={first}" in res.output
    assert yaml.safe_load((tmp_path / "fedavg-tie" / "summary.yaml").read_text())["best_config"] == {
        "checkpoint_every": first
    }
    assert (
        CliRunner().invoke(app, ["report", str(tmp_path / "fedavg-tie"), "--out", str(tmp_path / "r")]).exit_code == 0
    )
    assert pd.read_parquet(tmp_path / "r" / "best.parquet").iloc[0]["config"] == f"checkpoint_every={first}"


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweep_ended_by_its_round_budget_says_so(tmp_path, ray_local):
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY)
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            "fedavg",
            "--space",
            str(space),
            "--storage",
            str(tmp_path),
            "--max-total-rounds",
            "4",
            "--max-concurrent",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "round budget" in " ".join(res.output.split())
    summary = yaml.safe_load((tmp_path / "fedavg-tiny" / "summary.yaml").read_text())
    assert summary["ended_by"].startswith("the round budget") and "max_total_rounds 4" in summary["ended_by"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_trial_refusing_its_setting_is_not_retried_and_the_sweep_does_not_exit_0(tmp_path, ray_local):
    """batch_size 5000 passes the space's checks (any int is a batch size) but no client holds a batch that
    large: the trial fails once, with the run's sentence, and the sweep says so with exit code 2."""
    space = tmp_path / "big.yaml"
    space.write_text(
        "settings: {dataset: digits, partition: iid, clients: 4, rounds: 2, executor: sequential}\n"
        "search:\n  batch_size: {grid: [10, 5000]}\nsampler: grid\nsamples: 2\n"
    )
    res = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path)])
    assert (
        res.exit_code == 2
        and "1 trial of" in res.output
        and "fewer training samples than one batch" in " ".join(res.output.split())
    ), res.output
    failed = next(
        d for d in (tmp_path / "fedavg-big" / "search").glob("federated_trial_*") if (d / "error.txt").exists()
    )
    assert (d := failed / "error.txt").read_text().count("Failure #") == 1, d.read_text()  # never retried
    assert yaml.safe_load((tmp_path / "fedavg-big" / "summary.yaml").read_text())["best_config"] == {"batch_size": 10}


@pytest.mark.ray
@pytest.mark.slow
def test_a_diverging_trial_and_one_whose_worker_always_dies_are_failed_with_their_reasons_and_the_sweep_goes_on(
    tmp_path, ray_local, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    Path("dies.py").write_text(
        "import os, signal\nfrom algorithms.fedavg import FedAvg\n\n\n"
        "class Dies(FedAvg):  # FedAvg, but its worker is killed as it starts (as by the OOM killer) at lr = 0.5\n"
        "    name = 'dies'\n\n"
        "    def __init__(self, net, training, hp=None):\n"
        f"        if training.lr == 0.5 and os.getpid() != {os.getpid()}:\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        super().__init__(net, training, hp)\n"
    )
    space = tmp_path / "div.yaml"
    space.write_text(TINY.replace("lr: {loguniform: [0.001, 0.2]}", "lr: {grid: [0.05, 0.5, 1.0e+12]}"))
    db = tmp_path / "study.db"
    res = CliRunner().invoke(
        app, ["sweep", "./dies.py:Dies", "--space", str(space), "--storage", str(tmp_path), "--study-db", str(db)]
    )
    died = "3 failures, the last: The actor is dead because its worker process has died."
    assert res.exit_code == 0, res.output  # failed trials, not unfinished ones
    assert "diverged" in res.output and died in " ".join(res.output.split())
    by_lr = {t["params"]["lr"]: t for t in trials(tmp_path / "dies-div" / "search")}
    assert "diverged" in by_lr[1.0e12]["rows"][-1]["failed"]
    # not retried: it would diverge again
    assert (by_lr[1.0e12]["dir"] / "error.txt").read_text().count("Failure #") == 1
    assert by_lr[0.05]["rows"][-1]["round"] == 3 and not by_lr[0.5]["rows"]  # it never reported a round
    res = CliRunner().invoke(app, ["report", str(tmp_path / "dies-div"), "--out", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    runs = pd.read_parquet(tmp_path / "report" / "runs.parquet").sort_values("lr")
    assert (
        runs["rounds_run"].tolist() == [3, 0, 1]
        and runs["failed"].iloc[1] == died
        and "diverged" in runs["failed"].iloc[2]
    )
    import optuna  # the study outlives Ray in SQLite

    study = optuna.load_study(study_name="dies-div", storage=f"sqlite:///{db}")
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "FAIL", "FAIL"]


def test_stopping_rules():
    patience = Patience(3)
    assert not patience("t", {"round": 10, "best_round": 7})
    assert patience("t", {"round": 11, "best_round": 7})
    budget = RoundBudget(10)
    budget("a", {"round": 4})
    budget("b", {"round": 5})
    assert not budget.stop_all()
    budget("a", {"round": 5})
    assert budget.stop_all()
    scheduler = asha(5, 100)
    assert scheduler._time_attr == "round" and scheduler._max_t == 100 and asha(None, 100) is None
    rows = [
        {"round": 1, "acc": 0.5, "val_acc": 0.7},
        {"round": 2, "acc": 0.8, "val_acc": 0.6},
        {"round": 3, "train_loss": 1.0},
    ]
    figures = {"best_acc": 0.8, "best_val_acc": 0.7, "best_val_round": 1}
    assert selection(rows, "test") == {**figures, "selected_acc": 0.8, "best_round": 2, "score": 0.8 - 2e-12}
    assert selection(rows, "val") == {**figures, "selected_acc": 0.5, "best_round": 1, "score": 0.7 - 1e-12}
    # the same validation accuracy later: the earlier round stands
    tied = rows + [{"round": 4, "acc": 0.9, "val_acc": 0.7}]
    assert selection(tied, "val")["best_round"] == 1 and score(0.7, 1) > score(0.7, 4) > score(0.699999, 1)
    old = {"best_val_acc": 0.7, "best_acc": 0.8, "best_round": 3}  # a trial's result from before scores were reported
    assert (
        trial_score(old, "val") == score(0.7, 3)
        and trial_score(old, "test") == score(0.8, 3)
        and trial_score({**old, "score": 0.5}, "val") == 0.5
    )


def test_a_resumed_sweeps_round_budget_counts_the_rounds_its_trials_ran_before(tmp_path):
    """Tune saves the stopper when the sweep begins; resumed, it counts what the trials' files hold."""
    import pickle

    for trial_id, rounds in (("a", 4), ("b", 3)):
        (tmp_path / f"federated_trial_{trial_id}").mkdir()
        rows = [json.dumps({"trial_id": trial_id, "round": r}) for r in range(1, rounds + 1)]
        (tmp_path / f"federated_trial_{trial_id}" / "result.json").write_text(
            "\n".join(rows) + '\n{"trial_id": "a", "rou'
        )  # cut by a kill
    saved = pickle.dumps(RoundBudget(10, tmp_path))  # as Tune stores it with the experiment, before any round
    budget = pickle.loads(saved)
    assert not budget.stop_all()  # 4 + 3 before the resume
    budget("b", {"round": 4})  # b goes on
    assert not budget.stop_all()
    budget("c", {"round": 2})
    assert budget.stop_all()  # 4 + 4 + 2


def test_once_a_stage_is_stopping_its_search_suggests_no_trial():
    from optuna.distributions import FloatDistribution

    from tuner.sweep.recovery import INTERRUPTED, StoppableOptunaSearch

    search = StoppableOptunaSearch(space={"lr": FloatDistribution(0.001, 0.1, log=True)}, metric="score", mode="max")
    INTERRUPTED.clear()
    assert "lr" in search.suggest("a")
    INTERRUPTED.set()  # the first Ctrl-C
    try:
        assert search.suggest("b") is None  # Tune asks again later; by then it has stopped
    finally:
        INTERRUPTED.clear()


def _sweep_cmd(space, storage, *extra):
    return [
        sys.executable,
        "-m",
        "tuner.cli",
        "sweep",
        "fedavg",
        "--space",
        str(space),
        "--storage",
        str(storage),
        *extra,
    ]


def _resume_one_at_a_time(space, storage, env):
    """The sweep resumed in a process of its own, one trial at a time, to its end."""
    return subprocess.run(
        _sweep_cmd(space, storage, "--max-concurrent", "1", "--resume"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_is_one_line_and_130_and_a_sweep_stopped_or_killed_resumes_losing_no_trial_and_running_none_twice(
    tmp_path, spawn
):
    """Ctrl-C as a terminal sends it, to the whole process group (Ray's processes too, had they not blocked it): once
    while Ray starts (the sweep's folder exists, no trial yet), once as the second of three trials starts (one at a
    time); either way exit 130 with one line, no traceback, no crash, no trial started after it. The resumed sweep is
    then killed (SIGKILL, the whole group) once a trial has checkpointed mid-way, and a last --resume ends every
    trial: the finished one not run again, the interrupted ones from their checkpoints, not from round 1."""
    space = tmp_path / "ctrl.yaml"
    space.write_text(TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 60, checkpoint_every: 5"))
    # Tune's experiment snapshot every 0.5 s: trial folders reach the storage only with a snapshot (by default some
    # seconds apart), and a trial of 60 rounds (~5 s) is seen within its first second, a few rounds in
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNE_GLOBAL_CHECKPOINT_S": "0.5"}
    experiment = tmp_path / "fedavg-ctrl" / "search"
    for ready in (lambda: (tmp_path / "fedavg-ctrl").exists(), lambda: len(trials_so_far(experiment)) >= 2):
        resume = ["--resume"] if experiment.exists() else []
        proc = spawn(
            _sweep_cmd(space, tmp_path, "--max-concurrent", "1", *resume),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + 240
        while not ready():
            assert proc.poll() is None and time.time() < deadline, "the sweep ended before the moment came"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "Traceback" not in out and "Stopped" in out, out
    # the first trial finished, the second begun (60 rounds, ~5 s: it did not end before the Ctrl-C), no third;
    # the state saved, and the line says what is left and how to go on (SIGTERM, a scheduler's stop, is made a
    # Ctrl-C: tests/test_population.py stops a PBT sweep with it)
    last_rounds = [t["rows"][-1]["round"] if t["rows"] else 0 for t in trials(experiment)]  # in the order they started
    assert len(last_rounds) == 2 and last_rounds[0] == 60 and last_rounds[1] < 60, (last_rounds, out)
    assert "Stopped with 2 trials unfinished" in " ".join(out.split()) and "--resume" in out, out

    stopped = recorded_checkpoints(experiment)
    proc = spawn(
        _sweep_cmd(space, tmp_path, "--max-concurrent", "1", "--resume"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    # killed once Tune has recorded a checkpoint of a trial gone on in this sweep, short of its last round
    while not (midway := {d: r for d, r in recorded_checkpoints(experiment).items() if stopped.get(d, 0) < r < 60}):
        assert proc.poll() is None and time.time() < deadline, (
            "the resumed sweep was never seen with a trial checkpointed mid-way"
        )
        time.sleep(0.1)
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {d: checkpointed_states(d) for d in experiment.iterdir() if d.is_dir()}  # the finished trial's
    res = _resume_one_at_a_time(space, tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3/3" in res.stdout, res.stdout  # the progress line counts the trial finished before the kill
    after = trials(experiment)
    assert len(after) == 3 and len({json.dumps(t["params"], sort_keys=True) for t in after}) == 3
    for t in after:
        final = checkpointed_states(t["dir"])[-1]
        assert [r["round"] for r in final] == list(range(1, 61)), final
        if before.get(t["dir"]) and before[t["dir"]][-1][-1]["round"] == 60:  # a finished trial is not run again
            assert final == before[t["dir"]][-1]
    # a killed trial went on from its recorded checkpoint: the rounds up to it not run again
    for d, recorded in midway.items():
        final = checkpointed_states(d)[-1]
        assert all(r["ran_at"] < killed_at for r in final[:recorded]), (recorded, final, killed_at)


def test_a_trial_that_reported_its_last_round_is_done_even_if_the_stop_came_before_tune_completed_it():
    # A SIGTERM test once saw a trial report round 8 of 8 and the stop land before Tune completed it:
    # the sweep called it unfinished while its rows were whole.
    from types import SimpleNamespace

    from tuner.sweep.console import SweepProgress, stage_counts

    stage_counts.update(early=0, failed=0, done=0)
    progress = SweepProgress(total=3, rounds=8, select="val")
    progress.setup()
    last, early, failing = (SimpleNamespace(trial_id=i, last_result=None) for i in "abc")
    progress.on_trial_result(0, [], last, {"round": 8})  # the stop came here: no on_trial_complete
    assert stage_counts == {"early": 0, "failed": 0, "done": 1}
    last.last_result = {"round": 8}
    progress.on_trial_complete(0, [], last)  # completed after all: still one
    early.last_result = {"round": 3}
    progress.on_trial_result(0, [], early, {"round": 3})
    progress.on_trial_complete(0, [], early)  # stopped early by the scheduler
    progress.on_trial_result(0, [], failing, {"round": 8})
    failing.error_file, failing.last_result = None, {"round": 8}
    progress.on_trial_error(0, [], failing)  # it failed after its last round: failed, not done
    progress.on_experiment_end([])
    assert stage_counts == {"early": 1, "failed": 1, "done": 2}


PLACEMENT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import ray
    from ray.cluster_utils import Cluster
    from tuner.space import load_space
    from tuner.sweep.cluster import Resources
    from tuner.sweep.stages import sweep
    from tuner.cli import app
    from typer.testing import CliRunner

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=2, num_gpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    space = load_space(sys.argv[1], "fedavg")
    sweep(space, Path(sys.argv[2]) / "gpu", Resources(cpus_per_trial=1, gpus_per_trial=0.5, address=cluster.address))
    tuned = CliRunner().invoke(app, [  # a tuned comparison's three stages on the same cluster
        "reproduce", "roster", "--tune", "--method", "fedavg", "--trials", "2", "--seeds", "2", "--rounds", "2",
        "--grace", "1", "--set", "dataset=digits", "--set", "clients=4", "--storage", sys.argv[2],
        "--tuned-dir", str(Path(sys.argv[2]) / "tuned"), "--address", cluster.address, "--gpus-per-trial", "0.5",
    ])
    assert tuned.exit_code == 0, tuned.output
    print(json.dumps({"workers": [w.node_id for w in workers], "head": cluster.head_node.node_id}), flush=True)
    ray.shutdown()
    cluster.shutdown()
""")


@pytest.mark.ray
@pytest.mark.slow
def test_trials_of_a_sweep_and_a_tuned_comparison_land_where_the_gpus_are_and_never_exceed_them(tmp_path):
    space = tmp_path / "gpu.yaml"
    space.write_text(TINY.replace("samples: 3", "samples: 4"))  # two GPUs of two half-GPU trials each
    script = tmp_path / "placement.py"
    script.write_text(PLACEMENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, str(script), str(space), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    nodes = json.loads(res.stdout.strip().splitlines()[-1])
    ts = trials(tmp_path / "gpu" / "search")
    assert len(ts) == 4
    spans = {}
    for t in ts:
        first, last = t["rows"][0], t["rows"][-1]
        assert first["node"] in nodes["workers"] and first["gpu_ids"] != ""  # never on the GPU-less head
        spans.setdefault((first["node"], first["gpu_ids"]), []).append(
            (first["reported_at"] - first["time_total_s"], last["reported_at"])  # Ray's timestamp: whole seconds
        )
    for gpu, intervals in spans.items():  # half a GPU each: at most two trials share one at any moment
        for start, _ in intervals:
            assert sum(s <= start < e for s, e in intervals) <= 2, gpu
    # a tuned comparison spreads its defaults, search and seed reruns over the cluster's GPU nodes alike
    for stage in ("defaults", "search", "seeds"):
        ts = trials(tmp_path / "roster-tuned" / stage)
        assert len(ts) == 2 and (stage == "search" or all(t["rows"][-1]["round"] == 2 for t in ts)), stage  # ASHA
        assert all(t["rows"][0]["node"] in nodes["workers"] and t["rows"][0]["gpu_ids"] != "" for t in ts), stage


def test_reproduce_lists_the_cells_the_local_data_allows():
    from tuner.errors import UserError
    from tuner.reproduce import cells

    todo, skipped = cells("fedpac-table2")
    assert sorted(c["method"] for c in todo) == ["fedpac", "fedpac-cc", "fedpac-fa", "fedpac-none"]
    assert all(c["partition"] == "pac:20" and c["dataset"] == "fmnist" and c["protocol"] == "fedpac" for c in todo)
    assert any(s.startswith("Cifar10: no local data") for s in skipped)
    todo, skipped = cells("gpfl-table1", datasets=["fmnist"], methods=["gpfl", "fedper"])
    assert sorted((c["method"], c["partition"]) for c in todo) == [
        ("fedper", "dir:0.1"),
        ("fedper", "pat:2"),
        ("gpfl", "dir:0.1"),
        ("gpfl", "pat:2"),
    ]
    for table in ("gpfl-table1", "fedpac-table1", "fedcp-table2"):  # every method of every table is implemented
        assert not [s for s in cells(table)[1] if "not implemented" in s], table
    with pytest.raises(UserError, match="Unknown table 'gpfl-table9'"):
        cells("gpfl-table9")


@pytest.mark.ray
@pytest.mark.slow
def test_reproduce_runs_every_cell_with_seeds_and_prints_the_table(tmp_path, ray_local, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative --storage, through the same path handling as the sweep's (below)
    res = CliRunner().invoke(
        app,
        [
            "reproduce",
            "fedpac-table2",
            "--method",
            "fedpac",
            "--method",
            "fedpac-none",
            "--rounds",
            "1",
            "--seeds",
            "2",
            "--storage",
            "repro",
            "--set",
            "pac_train=60",
            "--set",
            "pac_test=20",
            "--set",
            "executor=sequential",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "FedPAC Table2-ablation" in res.output and "left out: Cifar10" in res.output
    storage = tmp_path / "repro"
    ts = trials(storage / "fedpac-table2" / "reproduce")
    assert sorted((t["params"]["cell"]["method"], t["params"]["seed"]) for t in ts) == [
        ("fedpac", 0),
        ("fedpac", 1),
        ("fedpac-none", 0),
        ("fedpac-none", 1),
    ]
    import pandas as pd

    tables = pd.read_parquet(storage / "fedpac-table2" / "report" / "tables.parquet")
    row = tables[
        (tables["table"] == "Table2-ablation")
        & (tables["method"] == "FedPAC")
        & (tables["column"] == "FMNIST dominant_s20")
    ].iloc[0]
    assert row["seeds"] == 2 and row["paper_mean"] == 91.83


@pytest.mark.ray
@pytest.mark.slow
def test_an_unreachable_cluster_is_one_sentence(tmp_path):
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY)
    res = CliRunner().invoke(
        app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), "--address", "127.0.0.1:1"]
    )
    assert (
        res.exit_code == 2 and "No Ray cluster answers at 127.0.0.1:1" in res.output and "Traceback" not in res.output
    )


@pytest.mark.parametrize("address, system_config", [(None, OWN_RAY_CONFIG), ("ray://head:10001", None)])
def test_the_ray_a_sweep_starts_prestarts_no_workers_and_a_joined_cluster_keeps_its_own_settings(
    monkeypatch, address, system_config
):
    import ray

    from tuner.errors import UserError
    from tuner.sweep.cluster import Resources, start_ray

    asked = {}

    def init(**kwargs):
        asked.update(kwargs)
        raise ConnectionError("stopped here: what start_ray asked of Ray is all this test needs")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever this xdist worker started before
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UserError, match="stopped here"):
        start_ray(Resources(address=address))
    assert asked["_system_config"] == system_config


@pytest.mark.ray
@pytest.mark.slow
def test_a_cluster_that_vanishes_under_a_sweep_is_one_sentence_and_a_sweep_never_joins_a_dead_or_foreign_one(
    tmp_path, spawn
):
    """Someone's `ray start` cluster on the machine, joined with --address, killed mid-sweep (its head node gone):
    one sentence within seconds (Ray itself would end the process a minute later with a log line). The cluster's
    address file stays behind, stale; a sweep without --address starts its own Ray instead of joining it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import secrets

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))} | {
        "PYTHONPATH": str(ROOT)
    }
    env |= {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
    }  # as `ray start` does where a token exists
    head = spawn(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            "--port",
            str(port),
            "--num-cpus",
            "1",
            "--node-ip-address",
            "127.0.0.1",
            "--include-dashboard=false",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address_file = Path("/tmp/ray/ray_current_cluster")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (address_file.exists() and str(port) in address_file.read_text()):
            assert head.poll() is None, "ray start failed"
            time.sleep(0.2)
        space = tmp_path / "gone.yaml"
        space.write_text(
            TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 30, checkpoint_every: 5").replace(
                "samples: 3", "samples: 2"
            )
        )
        # Ray joins a cluster at an explicit address with its token only when told (RAY_AUTH_MODE); refused, it
        # tries again for 20 s (RAY_gcs_server_port_wait_time_s, its own knob: one try here, the sentence is the same)
        refused_env = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"} | {"RAY_gcs_server_port_wait_time_s": "1"}
        res = subprocess.run(
            _sweep_cmd(space, tmp_path, "--address", f"127.0.0.1:{port}"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=refused_env,
            timeout=120,
        )
        assert res.returncode == 2 and "set RAY_AUTH_MODE=token" in res.stderr.splitlines()[-1], res.stdout + res.stderr
        proc = spawn(
            _sweep_cmd(space, tmp_path, "--address", f"127.0.0.1:{port}"),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        experiment = tmp_path / "fedavg-gone" / "search"
        while not any(t["rows"] for t in trials_so_far(experiment)):
            assert proc.poll() is None and time.time() < deadline + 120, "the sweep ended before a trial ran"
            time.sleep(0.2)
        os.killpg(head.pid, signal.SIGKILL)  # the head node and everything on it
        head.wait()
        out, _ = proc.communicate(timeout=50)  # before Ray's own minute is up
        last = [line for line in out.splitlines() if line.strip()][-1]
        gcs = re.search(r"joined the Ray cluster at ([\d.]+:\d+): 1 node, 1 CPU, 0 GPUs", out)  # its size: whose it is
        assert gcs and gcs[1].endswith(f":{port}") and proc.returncode == 1 and "Traceback" not in out, out
        assert last.startswith(f"error: The Ray cluster at {gcs[1]} stopped answering") and "--resume" in last, out
        res = _resume_one_at_a_time(space, tmp_path, env)
        assert res.returncode == 0 and "joined" not in res.stdout, res.stdout + res.stderr
        assert sorted(t["rows"][-1]["round"] for t in trials(experiment)) == [30, 30]
    finally:
        if address_file.exists() and str(port) in address_file.read_text():
            address_file.unlink()


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_and_report_take_relative_and_home_paths(tmp_path, monkeypatch, ray_local):
    home, work = tmp_path / "home", tmp_path / "work"
    for d in (home, work):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    cases = (
        ("", work, "group/one", "sweeps/group/one", work / "sweeps" / "group" / "one"),
        ("~/", home, "~/named", "~/named", home / "named"),
    )
    for prefix, folder, name, typed, sweep_dir in cases:  # --name is a folder under --storage, or a path of its own
        (folder / "tiny.yaml").write_text(TINY.replace("samples: 3", "samples: 1"))
        args = [
            "sweep",
            "fedavg",
            "--space",
            f"{prefix}tiny.yaml",
            "--storage",
            f"{prefix}sweeps",
            "--name",
            name,
            "--study-db",
            f"{prefix}study.db",
        ]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        assert len(trials(sweep_dir / "search")) == 1 and (folder / "study.db").exists()
        if prefix:  # a finished sweep restores and reports again
            res = CliRunner().invoke(app, [*args, "--resume"])
            assert res.exit_code == 0 and len(trials(sweep_dir / "search")) == 1, res.output
        res = CliRunner().invoke(app, ["report", typed, "--out", f"{prefix}report"])
        assert res.exit_code == 0, res.output
        assert pd.read_parquet(folder / "report" / "best.parquet")["trials"].tolist() == [1]


@pytest.mark.ray
def test_storage_failing_mid_sweep_is_one_sentence(tmp_path, ray_local, monkeypatch):
    import errno

    from ray import tune

    def full_disk(self):
        raise OSError(errno.ENOSPC, "No space left on device")  # as Ray Tune's own writes into --storage would fail

    monkeypatch.setattr(tune.Tuner, "fit", full_disk)
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY)
    res = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path / "sweeps")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert (
        "Cannot write to the sweep's storage" in res.output
        and "No space left on device" in res.output
        and "--resume" in res.output
    )


@pytest.fixture
def small_disk(tmp_path):
    """A file system of its own, 1.5 MiB beyond the sweep's reserve: it fills during the first trial."""
    from tuner.sweep.recovery import STORAGE_RESERVE

    disk = tmp_path / "disk"
    disk.mkdir()
    size = STORAGE_RESERVE + 1536 * 1024
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True
    ).returncode:
        pytest.skip("mounting a small tmpfs needs root with CAP_SYS_ADMIN")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.ray
@pytest.mark.slow
def test_a_storage_that_fills_stops_the_sweep_in_one_sentence_and_resume_finishes_it(small_disk, ray_local):
    space = small_disk.parent / "fill.yaml"
    space.write_text(
        TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 4, checkpoint_every: 1").replace(
            "samples: 3", "samples: 2"
        )
    )
    sweep = ["sweep", "fedavg", "--space", str(space), "--storage", str(small_disk), "--max-concurrent", "1"]
    res = CliRunner().invoke(app, sweep)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert (
        "Cannot write to the sweep's storage" in res.output
        and "No space left on device" in res.output
        and "--resume" in res.output
    )
    experiment = small_disk / "fedavg-fill" / "search"
    # whole: the reserve gave Tune room
    state = json.loads(next(experiment.glob("experiment_state-*.json")).read_text())
    assert state["trial_data"]
    assert not (small_disk / "fedavg-fill" / ".storage-reserve").exists()

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # space freed
    res = CliRunner().invoke(app, [*sweep, "--resume"])
    assert res.exit_code == 0, res.output
    after = trials(experiment)
    assert len(after) == 2
    for t in after:  # the trial cut short went on from its checkpoint: every round once
        assert [r["round"] for r in t["rows"]] == [1, 2, 3, 4]


def test_a_trial_takes_the_measured_share_of_a_gpu_by_default_and_what_it_asks_for_otherwise(monkeypatch):
    import ray

    from tuner.sweep.cluster import TRIALS_PER_GPU, Resources, trial_resources

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16, "GPU": 1})
    assert trial_resources(Resources()) == {"cpu": 1, "gpu": 1 / TRIALS_PER_GPU} and TRIALS_PER_GPU == 2
    assert trial_resources(Resources(gpus_per_trial=1))["gpu"] == 1
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2})
    assert trial_resources(Resources())["gpu"] == 0


def test_a_sweep_on_auto_weighs_compiling_against_the_rounds_a_worker_runs():
    from tuner.compile import CPU_COMPILE_ROUNDS, auto_engine
    from tuner.sweep.cluster import worker_rounds

    cpu, two_cores = {"cpu": 1, "gpu": 0}, {"CPU": 2}
    assert worker_rounds(cpu, 8, 15, None, two_cores) == 60  # the demo: 4 trials of 15 rounds a worker
    assert worker_rounds(cpu, 16, 50, None, two_cores) == 400
    assert worker_rounds(cpu, 16, 50, 16, {"CPU": 16}) == worker_rounds(cpu, 16, 50, 1, two_cores) / 16 == 50
    assert worker_rounds({"cpu": 1, "gpu": 0.5}, 8, 10, None, {"CPU": 16, "GPU": 1}) == 40  # two trials a GPU
    assert auto_engine("cpu", 400, "mlp", "gpfl") == "eager"  # a 16-trial, 50-round sweep: compiling would not repay
    assert auto_engine("cpu", CPU_COMPILE_ROUNDS["mlp"], "mlp", "gpfl") == "compiled"
    assert (
        auto_engine("cpu", CPU_COMPILE_ROUNDS["cnn4"], "cnn4", "gpfl") == "compiled"
        and auto_engine("cpu", 60, "a_users_backbone", "gpfl") == "eager"
    )


def test_a_trial_worker_starts_without_importing_torch():
    """Tune starts a worker for each pending trial, and one that a reused worker's trial overtakes is stopped at the
    end of the stage, which Tune waits on (up to 5 s) while the worker still loads the trainable: its module leaves
    torch and the engine to the trial."""
    code = "import sys, tuner.sweep.trainable; print(sorted({'torch', 'tuner.config'} & set(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_a_tuned_comparison_runs_searches_reruns_and_writes_what_a_run_takes_back(tmp_path, ray_local, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = [
        "reproduce",
        "roster",
        "--tune",
        "--method",
        "fedavg",
        "--method",
        "local",
        "--trials",
        "3",
        "--seeds",
        "2",
        "--rounds",
        "3",
        "--grace",
        "1",
        "--storage",
        "runs",
        "--set",
        "dataset=digits",
        "--set",
        "clients=4",
        "--space-dir",
        str(Path(__file__).resolve().parents[1] / "search_spaces"),
    ]
    res = CliRunner().invoke(app, command)
    assert res.exit_code == 0, res.output
    top = tmp_path / "runs" / "roster-tuned"
    assert "| method " in res.output and "rank defaults → tuned" in res.output  # the fair table, on the console too
    search = [t["params"] for t in trials(top / "search")]
    for method in ("fedavg", "local"):
        mine = [p for p in search if p["cell"]["method"] == method]
        paper = resolve_layers(method, [("test", {"dataset": "digits", "clients": 4})]).lr
        assert len(mine) == 3 and mine[0]["lr"] == paper  # the same trials each, the paper's default tried first
    # every trial's reports as TensorBoard event files, which docs/sweeps.md points `tensorboard --logdir` at
    assert all(list(d.glob("events.out.tfevents.*")) for d in (top / "search").glob("federated_trial_*"))
    defaults = sorted((p["cell"]["method"], p["seed"]) for p in [t["params"] for t in trials(top / "defaults")])
    reruns = sorted((p["tuned"]["method"], p["seed"]) for p in [t["params"] for t in trials(top / "seeds")])
    assert defaults == reruns == [("fedavg", 1), ("fedavg", 2), ("local", 1), ("local", 2)]

    runs = pd.read_parquet(top / "report" / "runs.parquet")
    fair = pd.read_parquet(top / "report" / "fair.parquet").set_index("method")
    for method in ("fedavg", "local"):
        by_seed = {
            stage: runs[(runs["method"] == method) & (runs["stage"] == stage)]
            .set_index("seed")["selected_acc"]
            .loc[[1, 2]]
            for stage in ("defaults", "seeds")
        }
        gain = difference(list(by_seed["seeds"].loc[[1, 2]]), list(by_seed["defaults"].loc[[1, 2]]), paired=True)
        assert fair.at[method, "gain"] == pytest.approx(100 * gain.mean)
        searched = runs[(runs["method"] == method) & (runs["stage"] == "search")]
        tuned = yaml.safe_load((tmp_path / "results/tuned/digits-dir0.1-4c-mlp" / f"{method}.yaml").read_text())
        assert tuned["provenance"]["rounds_trained"] == searched["rounds_run"].sum() == fair.at[method, "search_rounds"]
        assert sorted(tuned["provenance"]["seeds_test_acc"]) == sorted(by_seed["seeds"])
        assert tuned["settings"]["lr"] == searched.loc[searched[SCORE].idxmax(), "lr"]  # chosen by validation
    best = pd.read_parquet(top / "report" / "best.parquet").set_index("sweep")  # a best configuration a cell
    assert {m: best.at[f"roster-tuned/{m}-digits-dir0.1-4c", "trials"] for m in ("fedavg", "local")} == {
        "fedavg": 3,
        "local": 3,
    }
    share = pd.read_parquet(top / "report" / "fair_columns.parquet")["training_share"].iloc[0]
    assert 0 < share < 1

    # the tuned settings run as they were found; a data setting typed over them is refused
    ran = CliRunner().invoke(app, ["run", "fedavg", "--tuned", "digits-dir0.1-4c-mlp", "--rounds", "1", "--out", "r"])
    assert ran.exit_code == 0, ran.output
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["lr"] == tuned_lr(tmp_path, "fedavg")
    refused = CliRunner().invoke(app, ["run", "fedavg", "--tuned", "digits-dir0.1-4c-mlp", "--partition", "iid"])
    assert refused.exit_code == 2 and "was tuned with partition=dir:0.1, not iid" in refused.output
    methods = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "400"})
    assert re.search(r"fedavg .*│ digits-dir0.1-4c-mlp", methods.output)

    # resumed, a finished comparison runs nothing again; resumed with another budget, it is refused
    before = len(list(top.rglob("params.json")))
    again = CliRunner().invoke(app, [*command, "--resume"])
    assert again.exit_code == 0, again.output
    assert len(list(top.rglob("params.json"))) == before
    other = CliRunner().invoke(app, [*command, "--resume", "--trials", "4"])
    assert other.exit_code == 2 and "was started with other settings (trials: 3, now 4)" in other.output


def tuned_lr(root: Path, method: str) -> float:
    return yaml.safe_load((root / "results/tuned/digits-dir0.1-4c-mlp" / f"{method}.yaml").read_text())["settings"][
        "lr"
    ]


FORCED_EXPLOIT = """
settings: {dataset: digits, partition: iid, clients: 4, rounds: 6, executor: sequential, dtype: float64}
search:
  lr: {loguniform: [0.0001, 0.1]}
samples: 2
scheduler: {kind: KIND, perturbation_interval: 2, quantile: 0.5}
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pbt", "pb2"])
def test_population_training_on_ray_exploits_and_the_replay_it_prints_reruns_its_best(
    tmp_path, ray_local, monkeypatch, kind
):
    """One trial at a time, PBT pausing a trial at each perturbation while the other waits: the two alternate every
    2 rounds (the paper's lr 0.005 first, then a seeded draw, 0.0081). At round 2 neither has a checkpoint PBT kept;
    by round 4 the one behind takes the other's state (quantile 0.5 of two) and trains rounds 5 and 6 on (with 4
    rounds it would have none left, and no exploit happens). This test requires that exploit: a population where
    none happened fails it. The command the report prints for the best trial, run as printed,
    retrains its curve exactly (float64)."""
    from tuner.report.best import perturbed
    from tuner.schedule import ROUNDS_FILE, read_rounds

    space = tmp_path / "forced.yaml"
    space.write_text(FORCED_EXPLOIT.replace("KIND", kind))
    res = CliRunner().invoke(
        app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), "--name", "pop"]
    )
    assert res.exit_code == 0, res.output
    files = [
        max(d.glob(f"checkpoint_*/{ROUNDS_FILE}")) for d in (tmp_path / "pop" / "search").glob("federated_trial_*")
    ]
    own = [
        f"federated_trial_{json.loads(f.parents[1].joinpath('result.json').read_text().splitlines()[0])['trial_id']}"
        for f in files
    ]
    held = [{r["trial"] for r in read_rounds(f)[0]} for f in files]
    assert len(files) == 2 and any(trained != {name} for trained, name in zip(held, own, strict=True)), held

    monkeypatch.chdir(tmp_path)
    report = CliRunner().invoke(app, ["report", "pop", "--out", "r"])
    assert report.exit_code == 0, report.output
    best_md, schedule = (tmp_path / "r" / "best.md").read_text(), pd.read_csv(tmp_path / "r" / "schedule-pop.csv")
    drawn = (tmp_path / "r" / "schedule-pop.png").exists()
    assert drawn == perturbed(schedule) == ("the best trial's schedule" in best_md) != ("never perturbed" in best_md)
    printed = re.search(r"`(tuner run fedavg --config \S+ --schedule \S+)`", best_md).group(1)
    monkeypatch.chdir(tmp_path / "r")
    replay = CliRunner().invoke(app, [*printed.split()[1:], "--out", str(tmp_path / "replay")])
    assert replay.exit_code == 0, replay.output
    replayed = pd.read_parquet(tmp_path / "replay" / "metrics.parquet")
    best = next(f for f in files if pd.DataFrame(read_rounds(f)[0])["lr"].tolist() == schedule["lr"].tolist())
    trained = pd.read_parquet(best)
    assert list(replayed["acc"]) == list(trained["acc"]) and list(replayed["val_acc"]) == list(trained["val_acc"])


@pytest.mark.ray
@pytest.mark.slow
def test_a_population_trials_result_json_holds_a_row_for_every_round_it_trained(tmp_path, ray_local):
    """4 trials of 40 rounds perturbed every 5, reporting each round: every round a trial trained (its own rounds in
    its checkpoints, told apart by ran_at) has its row, though exploits restart trials within the sweep. Ray Tune's
    own writer left one such trial 21 rows of its 40 (tests/test_faults.py shows why)."""
    from tuner.schedule import ROUNDS_FILE, read_rounds

    space = tmp_path / "rows.yaml"
    space.write_text(
        TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 40").replace(
            "samples: 3", "samples: 4\nscheduler: {kind: pbt, perturbation_interval: 5}"
        )
    )
    res = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path)])
    assert res.exit_code == 0, res.output
    for t in trials(tmp_path / "fedavg-rows" / "search"):
        name = f"federated_trial_{t['rows'][0]['trial_id']}"
        trained = {
            (r["round"], r["ran_at"])
            for f in t["dir"].glob(f"checkpoint_*/{ROUNDS_FILE}")
            for r in read_rounds(f)[0]
            if r["trial"] == name
        }
        rows = [r for r in t["rows"] if not r.get("handed_over")]
        assert len(rows) >= len(trained), (name, [r["round"] for r in rows], sorted(trained))


@pytest.mark.ray
@pytest.mark.slow
def test_a_pbt_sweep_killed_mid_trial_resumes_losing_no_trial_and_training_no_round_twice(tmp_path, spawn):
    """PBT over 3 trials of 30 rounds, one at a time, killed (SIGKILL, the whole group) once Tune's saved state records
    a trial's checkpoint short of its last round; --resume ends every trial: each state's lineage holds rounds 1 to
    30 once, and the killed trial went on from a checkpoint: the first state it checkpointed after the kill began
    with a round 1 run before it. A perturbation every 10 rounds: 3 checkpoints a trial, all kept (4 are), so that
    state is still there when the sweep ends; no exploit can come before it, as a trial is exploited only when it
    reports."""
    space = tmp_path / "pbt.yaml"
    space.write_text(
        TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 30").replace(
            "samples: 3", "samples: 3\nscheduler: {kind: pbt, perturbation_interval: 10}"
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNE_GLOBAL_CHECKPOINT_S": "0.5"}
    experiment = tmp_path / "fedavg-pbt" / "search"
    proc = spawn(
        _sweep_cmd(space, tmp_path, "--max-concurrent", "1"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    # killed once Tune has recorded a trial's checkpoint short of its last round (what --resume restores it from)
    while not (midway := [d for d, r in recorded_checkpoints(experiment).items() if r < 30]):
        assert proc.poll() is None and time.time() < deadline, "the sweep was never seen with a trial checkpointed"
        time.sleep(0.1)
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # every state checkpointed before the kill, of every trial: a state restored from any of them (a donor's, where
    # the kill came as an exploit handed one over) begins with one of these rounds 1
    first_rounds = {(s[0]["trial"], s[0]["ran_at"]) for d in experiment.iterdir() for s in checkpointed_states(d)}
    res = _resume_one_at_a_time(space, tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
    after = trials(experiment)
    assert len(after) == 3
    for t in after:
        lineage = checkpointed_states(t["dir"])[-1]
        assert [r["round"] for r in lineage] == list(range(1, 31)), (t["dir"].name, lineage)
    for d in midway:
        trial_id = "_".join(d.name.split("_")[3:5])  # federated_trial_00000_<trial id>[_values]
        # when the rounds this trial itself ran after the kill ended, state by state (a donor's come with its state)
        own = [
            ([r["ran_at"] for r in s if r["trial"].endswith(trial_id) and r["ran_at"] > killed_at], s)
            for s in checkpointed_states(d)
        ]
        trained = [(min(times), s) for times, s in own if times]
        if trained:  # none where the kill came as a donor's last state was handed over: it trained no more
            resumed = min(trained, key=lambda t: t[0])[1]
            assert (resumed[0]["trial"], resumed[0]["ran_at"]) in first_rounds, (resumed, killed_at)


@pytest.mark.ray
@pytest.mark.slow
def test_a_tuned_comparison_stopped_by_ctrl_c_mid_search_resumes_to_the_end_running_no_finished_trial_again(
    tmp_path, spawn
):
    """Ctrl-C once the search stage has a trial under way: one line, exit 130, the defaults stage done and recorded;
    --resume runs the rest (the search's unfinished trials from their checkpoints) and writes the fair table."""
    command = [
        sys.executable,
        "-m",
        "tuner.cli",
        "reproduce",
        "roster",
        "--tune",
        "--method",
        "fedavg",
        "--trials",
        "2",
        "--seeds",
        "2",
        "--rounds",
        "30",
        "--storage",
        str(tmp_path),
        "--tuned-dir",
        str(tmp_path / "tuned"),
        "--space-dir",
        str(ROOT / "search_spaces"),
        "--max-concurrent",
        "1",
        "--set",
        "dataset=digits",
        "--set",
        "clients=4",
        "--set",
        "executor=sequential",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNE_GLOBAL_CHECKPOINT_S": "0.5"}
    proc = spawn(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    search, deadline = tmp_path / "roster-tuned" / "search", time.time() + 300
    while not [t for t in trials_so_far(search) if t["rows"]]:
        assert proc.poll() is None and time.time() < deadline, "the comparison ended before its search began"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in out and "--resume" in out, out
    record = yaml.safe_load((tmp_path / "roster-tuned" / "comparison.yaml").read_text())
    assert record["done"] == ["defaults"] and record["wall_s"] > 0
    defaults = {t["dir"].name: len(t["rows"]) for t in trials(tmp_path / "roster-tuned" / "defaults")}
    # a hang guard, 10x the whole test's quiet 103 s: a fresh clone beside a long measurement once took over 600
    resumed = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    res = subprocess.run([*command, "--resume"], **resumed)
    assert res.returncode == 0, res.stdout + res.stderr
    assert {t["dir"].name: len(t["rows"]) for t in trials(tmp_path / "roster-tuned" / "defaults")} == defaults
    searched = trials(search)
    assert len(searched) == 2 and all(
        set(r["round"] for r in t["rows"]) == set(range(1, 31)) for t in searched if t["rows"][-1]["round"] == 30
    )
    assert (tmp_path / "roster-tuned" / "report" / "fair.md").exists()
    assert yaml.safe_load((tmp_path / "roster-tuned" / "comparison.yaml").read_text())["done"] == [
        "defaults",
        "search",
        "seeds",
    ]
