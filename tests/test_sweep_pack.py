"""`tuner sweep --pack`: trials on one device trained as packs (tuner/sweep/pack_host.py), each still a Tune trial
reporting its own rounds, equal to its run alone, stopped by its scheduler, resumed after a stop."""

import json
import os
import signal
import subprocess
import time

import pandas as pd
import pytest
from sweeps import (
    EXPLOIT_BASE,
    ROOT,
    TINY,
    checkpointed_states,
    fresh_accuracies,
    recorded_checkpoints,
    run_trial,
    sweep_cmd,
    trials,
)
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


@pytest.mark.ray
@pytest.mark.slow
def test_a_packed_trial_exploited_goes_on_from_its_donors_state_and_its_rounds_file_replays_it(
    tmp_path, monkeypatch, ray_local
):
    """PBT's exploit in a pack: the trainable started, in a pack host, from another packed trial's round-2
    checkpoint with its own lr; its rounds 3-4 are the donor's state going on under that lr, as `tuner run
    --schedule` replays its rounds file alone (float64)."""
    from tuner.federated_run import run
    from tuner.settings.schedule import ROUNDS_FILE, load_schedule, read_rounds
    from tuner.sweep.pack_host import start_hosts, stop_hosts
    from tuner.sweep.trials import trial_config

    base = EXPLOIT_BASE
    hosts = start_hosts(2, 0.5, str(tmp_path / "cache"))
    try:
        donor = run_trial(monkeypatch, tmp_path, "donor", {"lr": 0.05}, base, hosts=hosts)
        recipient = run_trial(monkeypatch, tmp_path, "recipient", {"lr": 0.02}, base, donor=donor[0], hosts=hosts)
    finally:
        stop_hosts(hosts)
    rows = read_rounds(recipient[-1] / ROUNDS_FILE)[0]
    assert [(r["round"], r["trial"], r["lr"]) for r in rows] == [
        (1, "donor", 0.05),
        (2, "donor", 0.05),
        (3, "recipient", 0.02),
        (4, "recipient", 0.02),
    ]
    cfg = trial_config(base, {"lr": 0.9})
    replay = run(cfg, tmp_path / "replay", schedule=load_schedule(recipient[-1] / ROUNDS_FILE, cfg))  # the file sets lr
    trained = pd.read_parquet(recipient[-1] / ROUNDS_FILE)
    assert [r["acc"] for r in replay.history] == list(trained["acc"])
    assert max(abs(r["train_loss"] - t) for r, t in zip(replay.history, trained["train_loss"], strict=True)) < 1e-9


@pytest.mark.ray
@pytest.mark.slow
def test_a_packed_pbt_sweep_ends_every_trial_with_its_whole_lineage_and_an_exploited_one_replays_alone(
    tmp_path, ray_local
):
    """PBT over three packed trials (float64), the worst half exploiting: every trial ends at its last round with one
    row a round in its rounds file; where Ray's timing gave an exploit (seen in one run of two), `tuner run
    --schedule` on that file replays it alone (the exploit itself, certain: the in-process test above)."""
    from tuner.federated_run import run
    from tuner.settings.schedule import ROUNDS_FILE, load_schedule, read_rounds
    from tuner.sweep.trials import trial_config

    space = tmp_path / "pbt.yaml"
    base = {"dataset": "digits", "partition": "iid", "clients": 4, "rounds": 6, "executor": "sequential"}
    base |= {"dtype": "float64", "val_frac": 0.1}
    space.write_text(
        f"settings: {json.dumps(base)}\nsearch:\n  lr: {{loguniform: [0.001, 0.2]}}\nsamples: 3\n"
        "scheduler: {kind: pbt, perturbation_interval: 2, quantile: 0.5}\n"
    )
    args = ["sweep", "fedavg", "--space", str(space), "--storage", str(tmp_path), "--pack", "3"]
    res = CliRunner().invoke(app, [*args, "--cpus-per-trial", "0.5"])
    assert res.exit_code == 0, res.output
    finals = [
        max(t.glob(f"checkpoint_*/{ROUNDS_FILE}"))
        for t in (tmp_path / "fedavg-pbt" / "search").glob("federated_trial_*")
    ]
    assert len(finals) == 3
    for final in finals:
        rows = read_rounds(final)[0]
        assert [r["round"] for r in rows] == list(range(1, 7)), (final, rows)
        if rows[0]["trial"] != rows[-1]["trial"]:  # exploited
            cfg = trial_config({"method": "fedavg", **base}, {"lr": 0.9})
            replay = run(cfg, tmp_path / f"replay-{final.parent.parent.name}", schedule=load_schedule(final, cfg))
            assert [r["acc"] for r in replay.history] == list(pd.read_parquet(final)["acc"])


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
def test_a_packed_sweep_whose_host_or_whole_self_is_killed_or_stopped_resumes_each_trial_from_its_checkpoint(
    tmp_path, spawn
):
    """Three packed trials. Their host killed (SIGKILL, as the OOM killer would) once a trial has checkpointed
    mid-way: Ray starts it again and Tune restarts each trial from its checkpoint into it. Then the whole sweep
    killed (SIGKILL, its group) at a later checkpoint; --resume, stopped by Ctrl-C (130, one line); --resume to the
    end: every trial's rounds are its run alone's, none before a recorded checkpoint trained again."""
    space = tmp_path / "kill.yaml"
    space.write_text(TINY.replace("rounds: 3, checkpoint_every: 2", "rounds: 60, checkpoint_every: 5"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNE_GLOBAL_CHECKPOINT_S": "0.5"}
    experiment = tmp_path / "fedavg-kill" / "search"
    packed = ["--pack", "3", "--cpus-per-trial", "1"]

    def start(*extra):
        return spawn(
            sweep_cmd(space, tmp_path, *packed, *extra),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def checkpointed_beyond(proc, seen: dict) -> dict:
        """Once Tune records a trial's checkpoint past what `seen` holds and short of its end: those trials."""
        deadline = time.time() + 240
        while not (later := {d: r for d, r in recorded_checkpoints(experiment).items() if seen.get(d, 0) < r < 60}):
            assert proc.poll() is None and time.time() < deadline, "the sweep was never seen checkpointed mid-way"
            time.sleep(0.1)
        return later

    proc = start()
    first = checkpointed_beyond(proc, {})
    host = _host_of(proc.pid)
    os.kill(host, signal.SIGKILL)
    deadline = time.time() + 240
    while _host_of(proc.pid, missing_ok=True) in (None, host):  # Ray starts the host again
        assert proc.poll() is None and time.time() < deadline, "the pack host was not started again"
        time.sleep(0.1)
    midway = checkpointed_beyond(proc, first)  # the trials went on in the new host
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc = start("--resume")
    checkpointed_beyond(proc, {**first, **midway})
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in out and "Stopped" in out, out
    res = subprocess.run(
        sweep_cmd(space, tmp_path, *packed, "--resume"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert res.returncode == 0, res.stdout + res.stderr
    after = trials(experiment)
    assert len(after) == 3
    settings = {"method": "fedavg", **_settings(tmp_path, "fedavg-kill")}
    for t in after:
        final = checkpointed_states(t["dir"])[-1]
        assert [r["round"] for r in final] == list(range(1, 61)), final
        alone = fresh_accuracies(settings, t["params"])
        assert [r["acc"] for r in t["rows"] if r["round"] == 60] == alone[-1:]
    for d, recorded in midway.items():
        final = checkpointed_states(d)[-1]
        assert all(r["ran_at"] < killed_at for r in final[:recorded]), (recorded, final, killed_at)


def _host_of(session: int, missing_ok: bool = False) -> int | None:
    """The pid of the sweep's pack host: the process of the sweep's session that Ray titles after the PackHost actor."""
    res = subprocess.run(["pgrep", "-s", str(session), "-f", "ray::PackHost"], capture_output=True, text=True)
    pids = [int(p) for p in res.stdout.split()]
    assert len(pids) <= 1 and (pids or missing_ok), res
    return pids[0] if pids else None
