"""What a sweep shows while it runs: one progress line (trials running, done, stopped early, failed, and the
best figure so far) instead of Ray's tables, and Ray's and Optuna's own logging only with --verbose."""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

import optuna
from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.stopper import Stopper
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.selection import FIGURES
from tuner.sweep.trial_files import tune_failure

# The running stage's trials done (early-stopped among them) and failed, as SweepProgress counts them: Tune marks a
# trial stopped by Ctrl-C terminated like a finished one, and a restored experiment brings its own callbacks.
stage_counts: dict[str, int] = {}


def quiet(verbose: bool) -> None:
    """Ray's and Optuna's own logging only with --verbose: the progress line says what matters."""
    if not verbose:
        warnings.filterwarnings("ignore", module="ray")
        for name in ("ray", "ray.tune", "ray.train"):  # failures reach the progress line as one sentence instead
            logging.getLogger(name).setLevel(logging.CRITICAL)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", message="The reported value is ignored")  # a resumed trial repeats its rounds


class SweepProgress(Callback):
    """Trials running, done, stopped early and failed, and the best so far, on one line (instead of Ray's tables)."""

    def __init__(self, total: int, rounds: int, select: str) -> None:
        self.total, self.rounds, self.select = total, rounds, select
        self._reset()

    def _reset(self) -> None:
        self.progress = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "running {task.fields[running]}  early-stopped {task.fields[early]}  failed {task.fields[failed]}  "
                f"best {self.select} {{task.fields[best]}}"
            ),
            TimeElapsedColumn(),
        )
        self.task = self.progress.add_task("sweep", total=self.total, running=0, early=0, failed=0, best="-")
        self.running: set[str] = set()
        self.ended: set[str] = set()  # trials counted done
        self.counts = {"early": 0, "failed": 0, "done": 0}
        self.restored = False
        self.best = -math.inf

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its callbacks with the experiment; the live display stays behind."""
        return {"total": self.total, "rounds": self.rounds, "select": self.select}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "select" not in state:  # saved before the rule had one score: it named its figure
            self.select = "test" if state.get("metric") == "best_acc" else "val"
        self._reset()

    def setup(
        self,
        stop: Stopper | None = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        self.counts = stage_counts  # run_stage's, whether Tune made this callback or restored it from the experiment
        self.progress.start()

    def _show(self) -> None:
        best = f"{100 * self.best:.2f}%" if self.best > -math.inf else "-"
        done = self.counts["done"] + self.counts["failed"]
        self.progress.update(
            self.task,
            completed=done,
            running=len(self.running),
            early=self.counts["early"],
            failed=self.counts["failed"],
            best=best,
        )

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self._count_restored(trials)

    def _count_restored(self, trials: list[Trial]) -> None:
        """A resumed sweep's trials that finished or failed before count as done: at its first step, before any
        trial ends; or at its end, when every trial had ended before and Tune took no step."""
        if self.restored:
            return
        self.restored = True
        for t in trials:
            if t.status in ("TERMINATED", "ERROR"):
                self.counts["failed" if t.status == "ERROR" else "done"] += 1
                self.counts["early"] += (
                    t.status == "TERMINATED" and (t.last_result or {}).get("round", self.rounds) < self.rounds
                )
                self.best = max(self.best, (t.last_result or {}).get(FIGURES[self.select], -math.inf))
        self._show()

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.running.add(trial.trial_id)
        self._show()

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        value = result.get(FIGURES[self.select])
        if value is not None and not math.isnan(value):
            self.best = max(self.best, value)
        if not result.get("failed") and result.get("round", 0) >= self.rounds:
            # done once its last round is reported: a stop before Tune completes it must not call it unfinished
            self._count_done(trial, result["round"])
        self._show()

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.running.discard(trial.trial_id)
        self._count_done(trial, (trial.last_result or {}).get("round", self.rounds))
        self._show()

    def _count_done(self, trial: Trial, last_round: int) -> None:
        if trial.trial_id not in self.ended:
            self.ended.add(trial.trial_id)
            self.counts["done"] += 1
            self.counts["early"] += last_round < self.rounds

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.running.discard(trial.trial_id)
        if trial.trial_id in self.ended:  # it failed after its last round: failed, not done
            self.ended.discard(trial.trial_id)
            self.counts["done"] -= 1
        self.counts["failed"] += 1
        reason = (
            (trial.last_result or {}).get("failed")
            or (trial.error_file and tune_failure(Path(trial.error_file)))
            or "it raised an error; see error.txt in its trial directory"
        )
        self.progress.console.print(f"[yellow]trial {trial.trial_id} failed:[/] {reason}", highlight=False)
        self._show()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._count_restored(trials)
        self.progress.stop()
