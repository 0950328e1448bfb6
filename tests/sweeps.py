"""What the sweep tests share: a tiny space, the trials and checkpoints a sweep left, its command line."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

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
    from tuner.settings.schedule import ROUNDS_FILE, read_rounds

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

    from tuner.federated_run import build_simulation
    from tuner.sweep.trials import trial_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = trial_config(base, params)
        sim = build_simulation(cfg)
        return [sim.step()["acc"] for _ in range(cfg.rounds)]
    finally:
        torch.set_num_threads(threads)


def sweep_cmd(space, storage, *extra):
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


def resume_one_at_a_time(space, storage, env):
    """The sweep resumed in a process of its own, one trial at a time, to its end."""
    return subprocess.run(
        sweep_cmd(space, storage, "--max-concurrent", "1", "--resume"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


def tuned_lr(root: Path, method: str) -> float:
    return yaml.safe_load((root / "results/tuned/digits-dir0.1-4c-mlp" / f"{method}.yaml").read_text())["settings"][
        "lr"
    ]


# a donor and a recipient trial run by run_trial, 2 rounds each side of an exploit, exact in float64
EXPLOIT_BASE = {
    "method": "fedavg",
    "dataset": "digits",
    "partition": "iid",
    "clients": 4,
    "rounds": 4,
    "executor": "sequential",
    "dtype": "float64",
    "val_frac": 0.1,
    "checkpoint_every": 2,
}


def run_trial(
    monkeypatch, tmp_path, name: str, config: dict, base: dict, donor: Path | None = None, hosts: list | None = None
) -> list[Path]:
    """tuner.sweep.trainable.federated_trial as Ray Tune runs it, without Ray's scheduler: started from `donor` (a
    checkpoint folder, as an exploit hands it), each checkpoint it reports kept under tmp_path/name; `hosts`: a
    packed sweep's PackHosts, where its run then lives."""
    import shutil
    import types

    import ray
    import torch
    from ray import tune

    from tuner.sweep import trainable

    kept: list[Path] = []

    def report(metrics, checkpoint=None):
        if checkpoint is not None:
            kept.append(tmp_path / name / f"checkpoint_{len(kept):06d}")
            shutil.copytree(checkpoint.path, kept[-1])

    context = types.SimpleNamespace(
        get_trial_name=lambda: name,
        get_trial_id=lambda: name,
        get_trial_dir=lambda: str(tmp_path / name),
        get_node_id=lambda: "node",
        get_assigned_resources=lambda: {"CPU": 1},
    )
    monkeypatch.setattr(tune, "report", report)
    monkeypatch.setattr(tune, "get_checkpoint", lambda: tune.Checkpoint.from_directory(str(donor)) if donor else None)
    monkeypatch.setattr(tune, "get_context", lambda: context)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))  # the trial sets it; restored after the test
    threads = torch.get_num_threads()
    try:
        trainable.federated_trial(config, base, "val", 1, str(tmp_path / "cache"), 4, hosts)
    finally:
        torch.set_num_threads(threads)
    return kept
