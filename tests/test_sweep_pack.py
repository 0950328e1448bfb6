"""`tuner sweep --pack`: trials on one device trained as packs (tuner/sweep/pack_host.py), each still a Tune trial
reporting its own rounds, equal to its run alone, stopped by its scheduler, resumed after a stop."""

import os
import signal
import subprocess
import time

import pytest
from sweeps import ROOT, TINY, checkpointed_states, fresh_accuracies, recorded_checkpoints, sweep_cmd, trials
from typer.testing import CliRunner

from tuner.cli import app

PACKED = TINY.replace("samples: 3", "samples: 5\nstop: {grace: 1}").replace("rounds: 3", "rounds: 4")


@pytest.mark.ray
@pytest.mark.slow
def test_a_packed_sweeps_trials_are_each_its_run_alone_and_asha_stops_some(tmp_path, ray_local):
    """Five trials, packs of three: the first three start as one pack; a trial ASHA stops leaves it and the next
    takes its place at its own first round; every trial's rounds are those of its run alone."""
    space = tmp_path / "packed.yaml"
    space.write_text(PACKED)
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            "fedavg",
            "--space",
            str(space),
            "--storage",
            str(tmp_path),
            "--pack",
            "3",
            "--cpus-per-trial",
            "0.5",
        ],
    )
    assert res.exit_code == 0, res.output
    search = trials(tmp_path / "fedavg-packed" / "search")
    assert len(search) == 5
    settings = {"method": "fedavg", **{k: v for k, v in _settings(tmp_path).items() if k != "method"}}
    for t in search:
        accs = [r["acc"] for r in t["rows"]]
        assert accs == fresh_accuracies(settings, t["params"])[: len(accs)], t["params"]
    assert max(t["rows"][0]["pack"] for t in search) == 3  # the first three as one program
    assert any(len(t["rows"]) < 4 for t in search)  # ASHA stopped one


def _settings(tmp_path, sweep="fedavg-packed"):
    import yaml

    return yaml.safe_load((tmp_path / sweep / "search" / "experiment.yaml").read_text())["settings"]


def test_pack_mistakes_are_one_sentence(tmp_path):
    space = tmp_path / "p.yaml"
    space.write_text(TINY)
    for args, sentence in (
        (["--pack", "x"], "--pack takes a number of trials (8) or auto, not 'x'."),
        (["--pack", "0"], "--pack takes a number of trials of 1 or more, not 0."),
        (["--pack", "2", "--gpus-per-trial", "0.5"], "--pack gives each GPU's pack the whole GPU"),
    ):
        res = CliRunner().invoke(app, ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), *args])
        assert res.exit_code == 2 and sentence in " ".join(res.output.split()) and "Traceback" not in res.output


@pytest.mark.ray
@pytest.mark.slow
def test_a_packed_sweep_killed_mid_way_resumes_each_trial_from_its_checkpoint(tmp_path, spawn):
    """SIGKILL of the whole sweep (its hosts too) once a packed trial has checkpointed mid-way; --resume ends every
    trial from its checkpoint, no round before it trained again, each trial's rounds those of its run alone."""
    space = tmp_path / "kill.yaml"
    space.write_text(TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 40, checkpoint_every: 5"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNE_GLOBAL_CHECKPOINT_S": "0.5"}
    experiment = tmp_path / "fedavg-kill" / "search"
    packed = ["--pack", "3", "--cpus-per-trial", "1"]
    proc = spawn(
        sweep_cmd(space, tmp_path, *packed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    while not (midway := {d: r for d, r in recorded_checkpoints(experiment).items() if 0 < r < 40}):
        assert proc.poll() is None and time.time() < deadline, "the sweep was never seen checkpointed mid-way"
        time.sleep(0.1)
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    res = subprocess.run(
        sweep_cmd(space, tmp_path, *packed, "--resume"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert res.returncode == 0, res.stdout + res.stderr
    after = trials(experiment)
    assert len(after) == 3
    settings = {"method": "fedavg", **_settings(tmp_path, "fedavg-kill")}
    for t in after:
        final = checkpointed_states(t["dir"])[-1]
        assert [r["round"] for r in final] == list(range(1, 41)), final
        alone = fresh_accuracies(settings, t["params"])
        assert [r["acc"] for r in t["rows"] if r["round"] == 40] == alone[-1:]
    for d, recorded in midway.items():
        final = checkpointed_states(d)[-1]
        assert all(r["ran_at"] < killed_at for r in final[:recorded]), (recorded, final, killed_at)
