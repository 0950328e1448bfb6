"""The one selection rule: which round of a run counts, which run of a set is the best, and how ties go.

A run's rows give its figures best-so-far (`selection`); its **score** orders runs: the selecting figure
(validation accuracy under `select: val`, test accuracy under `select: test`, the papers' convention), then
the earlier round. Of runs with equal scores the one that **started first** is the best (`best_of`). The
trainable reports the score every round, so ASHA, patience's peers and Optuna's study rank by it; the
console's summary, summary.yaml, best.md, the tables' choice of configuration and the curves all choose
with `best_of`, so they name the same trial.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

FIGURES = {"val": "best_val_acc", "test": "best_acc"}  # each rule's selecting figure, best so far
SCORE = "score"  # what ASHA, patience's peers, Optuna's study, the console and `tuner report` rank runs by
TRAINABLE = "federated_trial"  # the name of the Tune trainable, and so of its trial directories

T = TypeVar("T")


def score(figure: float, at_round: int) -> float:
    """One number that orders runs by the selection rule: the selecting figure (to six decimals, finer than any
    accuracy a test set resolves), less 1e-12 a round, so of two equal figures the one reached earlier ranks first.
    One float, so Optuna's study, which ranks by its value alone, ranks as the console and the report do."""
    return round(figure, 6) - 1e-12 * at_round


def selection(history: list[dict], select: str) -> dict[str, float]:
    """Best-so-far figures of a run's rows. The selecting figure chooses the round (the earliest of equals); the
    selected accuracy is the test accuracy there. Rounds without evaluation are skipped."""
    scored = lambda key: [h for h in history if h.get(key) is not None and not math.isnan(h[key])]  # noqa: E731
    evals, vals = scored("acc"), scored("val_acc")
    best_val = max(vals, key=lambda h: h["val_acc"], default=None)  # max keeps the first of equals: the earliest round
    out = {
        "best_acc": max((h["acc"] for h in evals), default=math.nan),
        "selected_acc": math.nan,
        "best_round": math.nan,
        "best_val_acc": best_val["val_acc"] if best_val else math.nan,
        "best_val_round": best_val["round"] if best_val else math.nan,
        SCORE: math.nan,
    }
    figure = "acc" if select == "test" else "val_acc"
    chosen = max(evals if select == "test" else vals, key=lambda h: h[figure], default=None)
    if chosen is not None and chosen.get("acc") is not None and not math.isnan(chosen["acc"]):
        out |= {
            "selected_acc": chosen["acc"],
            "best_round": chosen["round"],
            SCORE: score(chosen[figure], chosen["round"]),
        }
    return out


def trial_score(metrics: dict, select: str) -> float:
    """A trial's score from its last reported metrics; a sweep resumed from before scores were reported is
    scored from its figures alike."""
    if SCORE in metrics:
        return metrics[SCORE]
    figure, at = metrics.get(FIGURES[select]), metrics.get("best_round")
    return math.nan if figure is None or at is None or math.isnan(figure) or math.isnan(at) else score(figure, at)


def trial_dirname(trial) -> str:
    """A trial's directory: the order Tune created it in (the count its experiment tag starts with), then its id
    and its values, so the folders list in the order the trials started and `started` can read it back."""
    count, _, values = trial.experiment_tag.partition("_")
    name = f"{TRAINABLE}_{int(count):05d}_{trial.trial_id}" + (f"_{values}" if values else "")
    return re.sub(r'[/()<>:"\\|?*]', "_", name)[:130]  # the characters and length Tune's own names keep to


def started(path: str | Path) -> tuple[str, float, str]:
    """Where a run stands in the order runs started: trials of one experiment by their creation count, runs of
    different folders by folder; a folder not named by `trial_dirname` (a `tuner run`) by its name."""
    path = Path(path)
    count = re.match(rf"{TRAINABLE}_(\d+)_", path.name)
    return str(path.parent), int(count.group(1)) if count else math.inf, path.name


def best_of(candidates: Iterable[T], score_of: Callable[[T], float], started_at: Callable[[T], Any]) -> T | None:
    """The candidate of the highest score; of equal scores, the one that started first. Unscored (NaN) ones never."""
    ranked = [(s, started_at(c), i, c) for i, c in enumerate(candidates) if not math.isnan(s := score_of(c))]
    return min(ranked, key=lambda r: (-r[0], r[1], r[2]), default=(None, None, None, None))[3]
