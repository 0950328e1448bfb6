"""When a trial or a sweep stops before its rounds: ASHA over rounds, patience, a budget of rounds for the
whole sweep, and failures that a retry would only meet again."""

from __future__ import annotations

from ray.tune import Callback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.stopper import CombinedStopper, Stopper


class Patience(Stopper):
    """Stop a trial whose selected round is more than `patience` rounds old (PFLlib's auto_break)."""

    def __init__(self, patience: int):
        self.patience = patience

    def __call__(self, trial_id, result):
        return result["round"] - result["best_round"] > self.patience

    def stop_all(self):
        return False


class RoundBudget(Stopper):
    """End the sweep once its trials have run `max_total_rounds` rounds together."""

    def __init__(self, max_total_rounds: int):
        self.max_total_rounds = max_total_rounds
        self.rounds: dict[str, int] = {}

    def __call__(self, trial_id, result):
        self.rounds[trial_id] = result["round"]
        return False

    def stop_all(self):
        return sum(self.rounds.values()) >= self.max_total_rounds


def asha(grace: int | None, rounds: int) -> ASHAScheduler | None:
    """ASHA over rounds: a trial reaching a rung below the top quarter of its peers stops there."""
    return ASHAScheduler(time_attr="round", max_t=rounds, grace_period=grace) if grace else None


def stoppers(patience: int | None, max_total_rounds: int | None) -> Stopper | None:
    rules = ([Patience(patience)] if patience else []) + ([RoundBudget(max_total_rounds)] if max_total_rounds else [])
    return CombinedStopper(*rules) if rules else None


class FinalFailures(Callback):
    """A trial that reports a failure it would meet again is failed at once, not retried from its checkpoint."""

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get("failed") and not result.get("retry"):
            trial.max_failures = 0  # read by Tune when the trial's error arrives, after this result
