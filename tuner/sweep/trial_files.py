"""What a trial left in its folder, read back: its reported rows (result.json), the rounds its checkpoints hold, a
population trial's lineage, why Ray Tune gave up on it. Read by the sweep as it runs and by the report after."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from tuner.settings.schedule import ROUNDS_FILE, read_rounds
from tuner.sweep.trials import TRIAL_RETRIES


def lineage_rows(trial_dir: Path, reported: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """A population-based trial's rows: those its state went through (its latest checkpoint's rounds file: a
    donor's rounds, then its own), then any it reported after that checkpoint; and its schedule (round, trial,
    settings). Its result.json alone mixes the rounds of the states it held before and after an exploit."""
    latest = latest_rounds_file(trial_dir)
    if latest is None:
        return reported, None
    schedule, settings = read_rounds(latest)
    lineage = pd.read_parquet(latest)
    after = reported[reported["round"] > lineage["round"].max()] if not reported.empty else reported
    return pd.concat([lineage, after], ignore_index=True), pd.DataFrame(schedule)[["round", "trial", *settings]]


def with_checkpointed_rounds(trial_dir: Path, reported: pd.DataFrame) -> pd.DataFrame:
    """A trial's reported rows, and any round its result.json lost taken from its latest checkpoint's rounds file
    (every round its state went through). Ray Tune writes result.json in a staging folder and copies it to the
    storage with each experiment snapshot; restarting a trial whose worker died, it copies the storage's file back
    over the staging one (`_restore_from_remote`, ray/tune/logger/logger.py), and the rows reported since the last
    snapshot are gone from it, although the checkpoint the trial restarts from holds their rounds. Seen in the soak
    test: a trial's result.json held rounds 1 and 3, its progress.csv and its checkpoints rounds 1 to 3."""
    latest = latest_rounds_file(trial_dir)
    if latest is None:
        return reported
    _, settings = read_rounds(latest)
    kept = pd.read_parquet(latest).drop(columns=["trial", *settings])  # who ran each round: a population's schedule
    lost = kept[~kept["round"].isin(reported["round"])] if not reported.empty else kept
    if lost.empty:
        return reported
    return pd.concat([reported, lost], ignore_index=True).sort_values("round").reset_index(drop=True)


def latest_rounds_file(trial_dir: Path) -> Path | None:
    """The rounds file of a trial's latest checkpoint (Tune numbers them in order), None before its first."""
    return max(trial_dir.glob(f"checkpoint_*/{ROUNDS_FILE}"), default=None)


def tune_failure(error_txt: Path) -> str:
    """Why Ray Tune gave up on a trial (its worker died more often than it is retried, or an error in its code):
    the first sentence of its last failure; "" while it was retried from its checkpoint, or never failed."""
    if not error_txt.exists():
        return ""
    failures = re.split(r"^Failure # \d+.*$", error_txt.read_text(), flags=re.M)[1:]
    if len(failures) <= TRIAL_RETRIES:
        return ""
    messages = [
        line
        for line in failures[-1].splitlines()
        if line.strip() and not line[0].isspace() and not line.startswith("Traceback")
    ]
    last = messages[-1].split(". ")[0].rstrip(".") if messages else "no message"
    return f"{len(failures)} failures, the last: {last}."


def trial_rows(result_json: Path) -> pd.DataFrame:
    """A trial's reported rows, one a round (a resumed trial's repeats counted once; a last line cut by a kill left
    out)."""
    if not result_json.exists():
        return pd.DataFrame()
    lines = [line for line in result_json.read_text().splitlines() if line.strip()]
    try:
        rows = [json.loads(line) for line in lines]
    except json.JSONDecodeError:  # a kill mid-write cuts the last line: the rows before it stand
        rows = [json.loads(line) for line in lines[:-1]]
    df = pd.DataFrame(rows)
    if df.empty or "round" not in df:
        return pd.DataFrame()
    # a resumed trial repeats rounds
    return df.drop_duplicates("round", keep="last").sort_values("round").reset_index(drop=True)
