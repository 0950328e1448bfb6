"""Many searches as one Ray Tune experiment: a table's cells each searched by its own Optuna study and stopped by its
own ASHA, the cells' trials sharing the cluster's slots (a stage per cell would leave slots idle at each stage's
tail and pay each stage's start: tuner/experiments/tuned_comparison.py).

A trial's `cell` (its method and data setting) is part of its configuration; the searcher gives each cell `trials`
suggestions from the cell's study, cells in turn, and hands each result back to the study that suggested it; the
scheduler keeps an ASHA per cell, so a trial is only ever compared with trials of its own cell.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from tuner.sweep.recovery import INTERRUPTED

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial


def cell_key(cell: dict) -> str:
    return json.dumps(cell, sort_keys=True)


class CellSearches(Searcher):
    """One search per cell (`searches`, keyed by cell_key), `trials` each, the cells taken in turn."""

    def __init__(self, searches: dict, cells: dict[str, dict], trials: int, metric: str, mode: str):
        super().__init__(metric=metric, mode=mode)
        self.searches, self.cells, self.trials = searches, cells, trials
        self.suggested = dict.fromkeys(searches, 0)
        self.owner: dict[str, str] = {}  # trial id -> its cell

    def suggest(self, trial_id: str) -> dict | None:
        if INTERRUPTED.is_set():  # the stage is stopping: no new trial (Tune would start one more)
            return None
        open_cells = [k for k in self.searches if self.suggested[k] < self.trials]
        if not open_cells:
            return Searcher.FINISHED  # type: ignore[return-value]  # Tune's word for an ended search
        key = min(open_cells, key=lambda k: self.suggested[k])  # the cell with fewest trials, in the table's order
        config = self.searches[key].suggest(trial_id)
        self.suggested[key] += 1
        self.owner[trial_id] = key
        return {**config, "cell": self.cells[key]}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self.owner:
            self.searches[self.owner[trial_id]].on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self.owner:
            self.searches[self.owner[trial_id]].on_trial_complete(trial_id, result=result, error=error)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


class CellSchedulers(FIFOScheduler):
    """An ASHA (what `make` builds) per cell: a trial stops early only against trials of its own cell; where `make`
    builds none (no grace), every trial runs to its end."""

    def __init__(self, make: Callable[[], TrialScheduler | None]) -> None:
        super().__init__()
        self.make, self.by_cell = make, dict[str, TrialScheduler]()

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        self._metric, self._mode = metric, mode
        return True

    def _of(self, trial: Trial) -> TrialScheduler:
        key = cell_key(trial.config["cell"])
        if key not in self.by_cell:
            made = self.make()
            self.by_cell[key] = FIFOScheduler() if made is None else made  # None: no early stopping
            self.by_cell[key].set_search_properties(self._metric, self._mode)
        return self.by_cell[key]

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        self._of(trial).on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: TuneController, trial: Trial) -> None:
        self._of(trial).on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller: TuneController, trial: Trial, result: dict) -> str:
        return self._of(trial).on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial, result: dict) -> None:
        self._of(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        self._of(trial).on_trial_remove(tune_controller, trial)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.by_cell, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.by_cell = pickle.load(f)
