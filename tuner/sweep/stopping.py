"""When a trial or a sweep stops before its rounds: ASHA over rounds, patience, a budget of rounds for the
whole sweep, and failures that a retry would only meet again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.stopper import CombinedStopper, Stopper

from tuner.sweep.trial_files import trial_rows


class Patience(Stopper):
    """Stop a trial whose selected round is more than `patience` rounds old (PFLlib's auto_break)."""

    def __init__(self, patience: int):
        self.patience = patience

    def __call__(self, trial_id: str, result: dict) -> bool:
        return result["round"] - result["best_round"] > self.patience

    def stop_all(self) -> bool:
        return False


class RoundBudget(Stopper):
    """End the sweep once its trials have run `max_total_rounds` rounds together. Tune saves a stopper once, when
    the sweep begins, so a resumed sweep's budget first counts, from `experiment`'s files, the rounds its trials
    ran before."""

    def __init__(self, max_total_rounds: int, experiment: Path | None = None):
        self.max_total_rounds, self.experiment = max_total_rounds, experiment
        self.rounds: dict[str, int] = {}
        self.counted_before = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        self._count_before()
        self.rounds[trial_id] = result["round"]
        return False

    def stop_all(self) -> bool:
        self._count_before()
        return sum(self.rounds.values()) >= self.max_total_rounds

    def _count_before(self) -> None:
        if self.counted_before or self.experiment is None:
            return
        self.counted_before = True
        for results in self.experiment.glob("*/result.json"):
            rows = trial_rows(results)  # a last line cut by a kill is left out
            if not rows.empty:
                self.rounds.setdefault(rows["trial_id"].iloc[-1], int(rows["round"].iloc[-1]))


@dataclass(frozen=True)
class StoppingRule:
    """A rule a space file's `stop:` may name beside ASHA's grace (the scheduler's): what it stops, and the Tune
    stopper its value builds, given the stage's folder (a rule may count what ran there before a resume).
    `search_only`: it bounds a search, and the reruns of a chosen configuration (seeds, a reproduction) go
    without it."""

    key: str
    help: str
    build: Callable[[int, Path | None], Stopper]
    search_only: bool = False


STOPPING_RULES = {
    rule.key: rule
    for rule in (
        StoppingRule(
            "patience", "stop a trial whose best round is more than this many rounds old", lambda n, _: Patience(n)
        ),
        StoppingRule(
            "max_total_rounds", "end the search after this many rounds over all trials", RoundBudget, search_only=True
        ),
    )
}


def stoppers(rules: dict[str, int], experiment: Path | None = None, search: bool = True) -> Stopper | None:
    """Tune's stopper for the rules named with their values (a stage's folder where one counts what ran there);
    `search`: False for reruns of a chosen configuration, which go without the search's own bounds."""
    built = [
        STOPPING_RULES[key].build(value, experiment)
        for key, value in rules.items()
        if value and (search or not STOPPING_RULES[key].search_only)
    ]
    return CombinedStopper(*built) if built else None


class FinalFailures(Callback):
    """A trial that reports a failure it would meet again is failed at once, not retried from its checkpoint."""

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        if result.get("failed") and not result.get("retry"):
            trial.max_failures = 0  # read by Tune when the trial's error arrives, after this result
