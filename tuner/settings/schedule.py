"""A schedule: the values of some settings round by round, what population-based training produces (a trial's
state went through its donors' rounds and its own, each with the values it had then) and what `tuner run
--schedule FILE` replays from round 1.

A sweep's trial writes `rounds.parquet` beside each checkpoint: each round's figures, the trial that ran it, when it
ended (`ran_at`, seconds since the epoch: a round run again after a kill has another) and its searched settings'
values, which the file's `settings` metadata names. A schedule file is such a file, or a
CSV or Parquet file of a `round` column and one column a setting. Replaying (tuner/federated_run.py) changes settings
where
the trial did, between two rounds, the way an exploit does: the next round's simulation is built with the new
values and takes the state the last one left, so it runs what the trial ran."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from tuner.errors import UserError, first_sentence
from tuner.files import write_atomic
from tuner.settings.config import RunConfig, apply_settings

ROUNDS_FILE = "rounds.parquet"
RAN_AT = "ran_at"
SCHEDULE_FILE = "schedule.parquet"  # a replaying run's copy of its schedule, which --resume reads


def write_rounds(path: Path, history: list[dict], ran: list[dict], settings: list[str]) -> None:
    """A state's rounds: each round's figures (`history`) beside who ran it, when, and the settings' values then
    (`ran`: round, trial, ran_at and one value a setting)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    who = pd.DataFrame(ran).set_index("round")
    rows = pd.DataFrame(history).set_index("round")
    # a setting's value, not a figure of its name
    rows = rows.drop(columns=[c for c in who.columns if c in rows.columns])
    table = pa.Table.from_pandas(rows.join(who, how="outer").reset_index(), preserve_index=False)
    metadata = {**(table.schema.metadata or {}), b"settings": json.dumps(settings).encode()}
    write_atomic(path, lambda p: pq.write_table(table.replace_schema_metadata(metadata), p))


def read_rounds(path: Path) -> tuple[list[dict], list[str]]:
    """A rounds file's schedule rows (round, trial, ran_at, the settings' values) and the settings' names. Files
    written before rounds carried their time have no ran_at."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    settings = json.loads((table.schema.metadata or {}).get(b"settings", b"[]"))
    when = [RAN_AT] if RAN_AT in table.column_names else []
    return table.select(["round", "trial", *when, *settings]).to_pylist(), settings


def load_schedule(path: Path, cfg: RunConfig) -> pd.DataFrame:
    """A schedule file as one row a round (index: round 1, 2, ...), one column a setting of cfg's method; every way it
    can be wrong is one sentence naming the file."""
    try:
        if path.suffix == ".csv":
            table = pd.read_csv(path)
        else:
            import pyarrow.parquet as pq

            arrow = pq.read_table(path)
            named = json.loads((arrow.schema.metadata or {}).get(b"settings", b"null"))
            table = arrow.to_pandas()
            table = table[["round", *named]] if named is not None else table
    except (OSError, ValueError, KeyError) as e:
        raise UserError(
            f"Schedule {path} cannot be read ({first_sentence(e)}); name a rounds.parquet a sweep wrote, or a "
            "CSV of round and settings."
        ) from None
    if "round" not in table:
        raise UserError(f"Schedule {path} has no 'round' column; it needs one, and a column a setting.")
    rounds = table["round"].tolist()
    if rounds != list(range(1, len(rounds) + 1)):
        raise UserError(
            f"Schedule {path} must have one row a round from round 1 on, in order; it has rounds "
            f"{rounds[:6]}{'...' if len(rounds) > 6 else ''}."
        )
    settings = table.drop(columns="round").set_index(pd.Index(rounds, name="round"))
    if settings.columns.empty:
        raise UserError(f"Schedule {path} names no setting; add a column a setting (e.g. lr, lam).")
    for name in settings.columns:
        # one sentence for a name that is no setting
        apply_settings(cfg, {name: _plain(settings[name].iloc[0])}, f"Schedule {path}")
    return settings


def settings_at(schedule: pd.DataFrame, round_: int) -> dict[str, Any]:
    """The settings of `round_`; past the schedule's last round, its last values."""
    row = schedule.loc[min(round_, len(schedule))]
    return {name: _plain(value) for name, value in row.items()}


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
