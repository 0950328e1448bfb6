"""A method tuned by several independent searches (`tuner reproduce --tune --searches R`): each search's best
configuration, its reruns on the comparison's seeds, and the gain over the defaults with an interval that holds the
searches' chance beside the seeds' (tuner/report/intervals.py searches_and_seeds)."""

from __future__ import annotations

import json
import math

import pandas as pd

from tuner.report.intervals import Difference, searches_and_seeds


def search_configs(record: dict, method: str, dataset: str) -> list[dict]:
    """Each search's best configuration of `method` on `dataset`, in the order of the searches' seeds; [] for a
    comparison of one search a method (its reruns are then one configuration's)."""
    if record.get("asked", {}).get("searches", 1) == 1:
        return []
    found = [(json.loads(k), v) for k, v in (record.get("best") or {}).items()]
    # a cell names its dataset where the table has several (else the comparison's settings do)
    mine = [
        (c.get("seed", 0), v.get("config"))
        for c, v in found
        if (c["method"], c.get("dataset", dataset)) == (method, dataset)
    ]
    return [config for _, config in sorted((s, c) for s, c in mine if c is not None)]


def reruns_of(config: dict, reruns: pd.DataFrame) -> pd.Series:
    """The selected accuracy by seed of the reruns of one configuration (a hyperparameter's column is hp_NAME)."""
    kept = pd.Series(True, index=reruns.index)
    for name, value in config.items():
        column = reruns[name if name in reruns else f"hp_{name}"]
        kept &= column.map(lambda v, want=value: _same(v, want))
    return reruns[kept].dropna(subset=["selected_acc"]).set_index("seed")["selected_acc"]


def gain_over_searches(defaults: pd.Series, tuned: list[pd.Series]) -> tuple[list[int], Difference]:
    """(the seeds every search's reruns and the defaults share, the gain: every search's rerun minus the defaults run
    of its seed, searches and seeds each a random effect)."""
    seeds = sorted(set(defaults.index).intersection(*[set(t.index) for t in tuned]))
    gains = [[t.loc[s] - defaults.loc[s] for s in seeds] for t in tuned]
    gain = searches_and_seeds(gains) if len(seeds) > 1 else Difference(math.nan, math.nan, math.nan, math.nan)
    return seeds, gain


def _same(value, want) -> bool:
    if isinstance(want, float) and isinstance(value, float):
        return math.isclose(value, want, rel_tol=1e-12)
    return value == want or str(value) == str(want)
