"""A sweep stopped (Ctrl-C, SIGTERM), killed (SIGKILL) or out of storage, and resumed: no trial lost, none run twice,
no round before a recorded checkpoint trained again."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from sweeps import (
    ROOT,
    TINY,
    checkpointed_states,
    recorded_checkpoints,
    resume_one_at_a_time,
    sweep_cmd,
    trials,
    trials_so_far,
)
from typer.testing import CliRunner

from tuner.cli import app


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
            sweep_cmd(space, tmp_path, "--max-concurrent", "1", *resume),
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
        sweep_cmd(space, tmp_path, "--max-concurrent", "1", "--resume"),
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
    res = resume_one_at_a_time(space, tmp_path, env)
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
        sweep_cmd(space, tmp_path, "--max-concurrent", "1"),
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
    res = resume_one_at_a_time(space, tmp_path, env)
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
