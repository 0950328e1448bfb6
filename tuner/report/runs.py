"""The runs under the given paths, and one summary row each.

Runs are `tuner run` directories (config.yaml + metrics.parquet) and the trials of the Ray Tune experiments
of `tuner sweep` / `tuner reproduce` (experiment.yaml + trial folders). A file that cannot be read is one line
of the report, never its end.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from functools import partial
from pathlib import Path

import pandas as pd
import yaml

from tuner.errors import UserError, first_sentence
from tuner.files import LOCK_FILE, lock_holder
from tuner.plugins import method_title
from tuner.run_folder import RunDir, read_environment
from tuner.selection import SCORE, best_of, selection, started
from tuner.settings.config import RunConfig
from tuner.sweep.schedulers import SCHEDULERS
from tuner.sweep.trial_files import lineage_rows, trial_rows, tune_failure, with_checkpointed_rounds
from tuner.sweep.trials import trial_config

SELECTION = {"test": "best test round", "val": "test at the best validation round"}
RUN_ENVIRONMENT = ("device", "torch", "commit")  # a `tuner run`'s, from its environment.json
# Settings that do not make a configuration another one: seeds (mean ± std runs over them) and plumbing.
NOT_CONFIGURATION = (
    "seed",
    "partition_seed",
    "val_seed",
    "executor",
    "device",
    "cohort_chunk",
    "steps_per_call",
    "conv_form",
    "eval_batch",
    "checkpoint_every",
    "data_dir",
    "download",
)
FINAL_STAGES = ("seeds", "reproduce", "defaults")  # runs made to be reported (a tuned comparison's defaults too)
POPULATION = tuple(name for name, s in SCHEDULERS.items() if s.hands_states)  # trials take other trials' states


UNREADABLE = (
    ValueError,
    OSError,
    KeyError,
    TypeError,
    yaml.YAMLError,
    UserError,
)  # damaged, truncated, or naming what is gone


def find_runs(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """Every run under `paths` (its stage, RunConfig and per-round rows), and one line for each file that
    could not be read (truncated by a kill, a full disk, a method file that is gone): skipped, not fatal."""
    runs, unreadable = [], []

    def read(what: Path, load):
        try:
            return load()
        except UNREADABLE as e:
            unreadable.append(f"{what}: {first_sentence(e)}")
            return None

    for root in paths:
        if not root.exists():
            raise UserError(f"{root} does not exist; name a run directory, a sweep or a folder holding them.")
        for config in sorted(root.rglob("config.yaml")):
            run_dir = RunDir(config.parent)
            if run_dir.metrics.exists():
                run = read(run_dir.path, partial(_run_info, run_dir))
                runs += [run] if run else []
        for experiment in sorted(root.rglob("experiment.yaml")):
            info = read(experiment, partial(_experiment_info, experiment))
            for params in sorted(experiment.parent.glob("*/params.json")) if info else []:
                run = read(params.parent, partial(_trial, params, experiment, info))
                runs += [run] if run else []
    if not runs:
        running = still_running(paths)
        if running:
            raise UserError(
                f"No run under {', '.join(map(str, paths))} has finished a round yet: {running[0]}; report "
                "again once a round is in."
            )
        problem = f" ({len(unreadable)} unreadable: {unreadable[0]})" if unreadable else ""
        raise UserError(
            f"No readable runs under {', '.join(map(str, paths))}{problem}; point at `tuner run` or `tuner "
            "sweep` results."
        )
    return runs, unreadable


def still_running(paths: list[Path]) -> list[str]:
    """The sweeps, reproductions and runs under `paths` whose command still holds their folder, each with how far it
    got."""
    out = []
    for root in paths:
        for lock in sorted({root / LOCK_FILE, *root.rglob(LOCK_FILE)}):
            holder = lock_holder(lock.parent)
            if holder:
                trials = len(list(lock.parent.rglob("params.json")))
                if trials:
                    progress = f"{trials} trial{'s' * (trials != 1)} started"
                else:
                    progress = (
                        "in its first round" if (lock.parent / "config.yaml").exists() else "no trial started yet"
                    )
                out.append(f"{lock.parent} is still running ({holder}; {progress})")
    return out


def _run_info(run_dir: RunDir) -> dict:
    """A `tuner run` folder as a run of the report (a run of its own: selected by test accuracy, as the papers)."""
    return {
        "run": str(run_dir.path),
        "stage": "run",
        "experiment": "",
        "select": "test",
        "config": run_dir.read_config(),
        "rows": pd.read_parquet(run_dir.metrics),
        "environment": read_environment(run_dir.path) if run_dir.environment.exists() else [],
    }


def _experiment_info(path: Path) -> dict:
    info = yaml.safe_load(path.read_text())
    if not isinstance(info, dict) or "stage" not in info or "settings" not in info:
        raise ValueError("not an experiment description written by tuner sweep")
    return info


def _trial(params: Path, experiment: Path, info: dict) -> dict | None:
    rows, schedule = trial_rows(params.parent / "result.json"), None
    if info.get("scheduler") in POPULATION:
        rows, schedule = lineage_rows(params.parent, rows)
    else:
        rows = with_checkpointed_rounds(params.parent, rows)
    sampled = json.loads(params.read_text())
    config = trial_config(info["settings"], sampled)
    finished = not rows.empty and rows["round"].max() >= config.rounds
    failed = "" if finished else tune_failure(params.parent / "error.txt")
    if rows.empty and not failed:  # not started yet
        return None
    return {
        "run": str(params.parent),
        "stage": info["stage"],
        "experiment": str(experiment.parent),
        "rows": rows,
        "select": info.get("select", "test"),
        "config": config,
        # a tuned comparison's trials carry their table cell beside the values searched
        "searched": [k for k, v in sampled.items() if not isinstance(v, dict)] if info["stage"] == "search" else [],
        "failed": failed,
        "log_scale": info.get("log_scale"),
        "schedule": schedule,
    }


def config_key(cfg: RunConfig) -> str:
    """Identifies a configuration across seeds."""
    d = {k: v for k, v in asdict(cfg.settings()).items() if k not in NOT_CONFIGURATION}
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


def summarize(run: dict, select: str | None) -> dict:
    """One run's figures; `select` None: the run's own rule (its sweep's, else the papers' best test round)."""
    cfg, rows = run["config"], run["rows"]
    select = select or run["select"]
    evals = rows[rows["acc"].notna()] if "acc" in rows else rows.iloc[0:0]
    out = {
        "run": run["run"],
        "stage": run["stage"],
        "experiment": run["experiment"],
        "method": cfg.method,
        "title": method_title(cfg.method),
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "clients": cfg.clients,
        "join_ratio": str(cfg.join_ratio),
        "backbone": cfg.backbone,
        "seed": cfg.seed,
        "lr": cfg.lr,
        "batch_size": cfg.batch_size,
        "local_epochs": cfg.local_epochs,
        "rounds_planned": cfg.rounds,
        "rounds_run": int(rows["round"].max()) if len(rows) else 0,
        "config_key": config_key(cfg),
        "failed": _failure(rows) or run.get("failed", ""),
        "selected_by": select,
        "time_s": float(rows["time_s"].sum()) if "time_s" in rows else math.nan,
        # where its rounds ran (a run resumed elsewhere names each place, in order); "" where not recorded
        **{
            key: "; ".join(dict.fromkeys(str(e.get(key, "")) for e in run.get("environment", [])))
            for key in RUN_ENVIRONMENT
        },
        **{f"hp_{k}": v for k, v in cfg.hparams.items()},
    }
    chosen = selection(rows.to_dict("records"), select)
    out |= {
        "val_acc": chosen["best_val_acc"],
        "val_round": chosen["best_val_round"],
        SCORE: chosen[SCORE],
    }  # what chose, under val
    if math.isnan(chosen["selected_acc"]):
        return out | {"best_acc": math.nan, "best_round": math.nan, "selected_acc": math.nan}
    at = evals[evals["round"] == chosen["best_round"]].iloc[0]
    return out | {
        "best_acc": chosen["best_acc"],
        "best_round": int(chosen["best_round"]),
        "selected_acc": chosen["selected_acc"],
        "acc_std": float(at.get("acc_std", math.nan)),
        "acc_cv": float(at.get("acc_cv", math.nan)),
        "final_acc": float(evals["acc"].iloc[-1]),
        "final_round": int(evals["round"].iloc[-1]),
    }


def _failure(rows: pd.DataFrame) -> str:
    """The failure its last row reports; one before it was retried past (out of memory once, then the rounds went
    on)."""
    if "failed" not in rows or rows.empty or pd.isna(rows["failed"].iloc[-1]):
        return ""
    return str(rows["failed"].iloc[-1])


def best_run(runs: pd.DataFrame):
    """The label of the best of these summary rows by the selection rule (ties: the run that started first)."""
    return best_of(runs.index, lambda i: runs.at[i, SCORE], lambda i: started(runs.at[i, "run"]))
