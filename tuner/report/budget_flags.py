"""Where a tuned comparison's budget may have cut the search short or been spent unequally: a tuned value at its
range's edge (the best may lie beyond it: widen the range), a tuned rerun that chose its last round (it was still
improving: give it more rounds), a search over the local work (its trials' local steps vary where the others'
do not). The fair table marks them (tuner/report/fair.py)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

EDGE = 0.05  # a value within this share of its range, on its scale, of either end is at the edge
NUMBERS = ("uniform", "loguniform", "int")  # a categorical or grid choice has no edge to lie beyond
LOCAL_WORK = ("local_epochs", "batch_size")  # the settings that change how many local steps a trial takes


def at_edge(search: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """The tuned settings within EDGE of their range's end (on a log scale for loguniform), as "NAME top" or "NAME
    bottom", in the search's order."""
    out = []
    for name, spec in search.items():
        kind, bounds = next(iter(spec.items()))
        if kind not in NUMBERS or config.get(name) is None:
            continue
        scale = math.log if kind == "loguniform" else float
        low, high, value = scale(bounds[0]), scale(bounds[1]), scale(config[name])
        place = (value - low) / (high - low)
        out += [f"{name} top"] if place >= 1 - EDGE else [f"{name} bottom"] if place <= EDGE else []
    return out


def chose_last_round(reruns: pd.DataFrame) -> int:
    """How many of these runs' validation chose their last planned round."""
    return int((reruns["val_round"] == reruns["rounds_planned"]).sum())


def at_edge_of_searches(search: dict[str, Any], configs: list[dict[str, Any]]) -> list[str]:
    """at_edge over each search's best configuration: a flag every search shares as at_edge writes it, one only some
    share with how many, "lr top (2/3 searches)", in the order they first appear."""
    found = [flag for config in configs for flag in at_edge(search, config)]
    counts = {flag: found.count(flag) for flag in found}
    return [f if n == len(configs) else f"{f} ({n}/{len(configs)} searches)" for f, n in counts.items()]
