"""What a stage survives: a Ctrl-C or SIGTERM stops it cleanly (the search suggests no trial after it, Ray Tune saves
its state), a storage that fills or goes read-only stops it as a Ctrl-C does with a reserve given back first, a trial
restarted within the stage keeps the rows it reported, and a resumed stage gets back the trials Ray Tune lost with
their worker and reads past error files cut short."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
from ray.tune.search.optuna import OptunaSearch

from tuner.errors import UserError
from tuner.files import unwritable_reason, write_text_atomic

RESERVE_FILE = ".storage-reserve"  # the space StorageWatch gives back when the storage fills
STORAGE_RESERVE = 16 * 2**20  # bytes held free in a sweep's storage while it runs, for Ray Tune's last state snapshot
# a reserve file -> why its storage failed; set by StorageWatch, read by run_stage
storage_failures: dict[str, str] = {}


class StorageWatch(Callback):
    """A failing trial may have met a full or unwritable storage; then every later trial would fail too. The sweep
    then stops as on Ctrl-C, with the reserve given back first: on a full disk Ray Tune cuts short the experiment
    state and the trial files it rewrites, and --resume would find them damaged."""

    def __init__(self, reserve: Path):
        self.reserve = reserve

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._check(trial)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._check(trial)

    def _check(self, trial: Trial) -> None:
        if str(self.reserve) in storage_failures:
            return
        checkpoints = sorted(
            Path(trial.path or self.reserve.parent).glob("checkpoint_*")
        )  # room for one more checkpoint, or 1 MiB
        room = max(
            2**20, sum(f.stat().st_size for f in checkpoints[-1].rglob("*") if f.is_file()) if checkpoints else 0
        )
        reason = unwritable_reason(self.reserve.parent, room)
        if reason:
            storage_failures[str(self.reserve)] = reason
            self.reserve.unlink(missing_ok=True)
            # where Tune catches it; elsewhere the sweep runs on
            if threading.current_thread() is threading.main_thread():
                os.kill(os.getpid(), signal.SIGINT)


class _KeepsWrittenRows:
    """Ray Tune writes a trial's rows in the sweep process's staging folder and copies them to the storage with each
    saved state; as a trial starts it copies the storage's file over the staging one (result.json each time,
    ray/tune/logger/json.py; progress.csv after the trial ended, as a failed one does, csv.py; Ray 2.60), meant for
    --resume in a new process. A trial restarted within the stage (a population's exploit, a worker that died) then
    lost every row since the last save: a population trial that trained 40 rounds, reporting each, was left with 21.
    Here the storage's file is taken only where the stage has none of its own."""

    def _restore_from_remote(self, file_name: str, trial: Trial) -> None:
        if trial.local_path is None or not Path(trial.local_path, file_name).exists():
            super()._restore_from_remote(file_name, trial)  # type: ignore[misc]


class ResultRows(_KeepsWrittenRows, JsonLoggerCallback):
    """result.json, every reported row kept across restarts within the stage."""


class ProgressRows(_KeepsWrittenRows, CSVLoggerCallback):
    """progress.csv, every reported row kept across restarts within the stage."""


INTERRUPTED = threading.Event()  # set by a stage's first Ctrl-C: the search suggests no trial after it


def _ctrl_c(signum: int, frame: FrameType | None) -> None:
    """The first Ctrl-C of a running stage (or SIGTERM, or a full storage: both send one) stops the search from
    suggesting trials and asks Ray Tune to stop as on its own Ctrl-C (SIGUSR1: it saves the experiment's state, then
    ends); a second, or one before Tune runs, stops at once."""
    if INTERRUPTED.is_set() or signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        raise KeyboardInterrupt
    INTERRUPTED.set()
    os.kill(os.getpid(), signal.SIGUSR1)


class StoppableOptunaSearch(OptunaSearch):
    """Optuna's search, which suggests no trial once its stage is stopping (Tune would start one more)."""

    def suggest(self, trial_id: str) -> dict | None:
        return None if INTERRUPTED.is_set() else super().suggest(trial_id)


def storage_failed(sweep_dir: Path, reason: str) -> UserError:
    return UserError(
        f"Cannot write to the sweep's storage {sweep_dir} ({reason}); the sweep stopped and what is already "
        "there stays: "
        "free space or fix the folder, then run the same command with --resume."
    )


def requeue_lost_trials(path: Path) -> int:
    """Mark pending, in the stage's saved state, the trials Ray Tune failed while they were not running, and return
    how many. Tune hands a finished trial's worker the next trial (reuse_actors); a worker killed in between (the
    OOM killer) fails that trial in its reset, unretried: Tune recovers running trials only (Ray 2.60,
    `TuneController._process_trial_failure`). Such a trial has retries left; one that failed for good has used them
    up, or reported a failure that FinalFailures made final (no retries). A restore then runs it from its last
    checkpoint, or round 1. Its Optuna trial stays failed (TPE learns nothing from the rerun); a saved state of
    another layout is left alone."""
    state_file = max(path.glob("experiment_state-*.json"), default=None)  # the newest: the one Tune restores
    if state_file is None:
        return 0
    try:
        state = json.loads(state_file.read_text())
        lost = 0
        for entry in state["trial_data"]:
            trial, meta = json.loads(entry[0]), json.loads(entry[1])
            if trial["status"] != "ERROR" or not 0 <= meta["num_failures"] <= trial["max_failures"]:
                continue
            trial["status"], meta["error_filename"], meta["pickled_error_filename"] = "PENDING", None, None
            entry[0], entry[1] = json.dumps(trial), json.dumps(meta)
            for name in ("error.txt", "error.pkl"):  # else the report would read its rerun as failed
                (path / trial["relative_logdir"] / name).unlink(missing_ok=True)
            lost += 1
    except (KeyError, TypeError, ValueError, IndexError):
        return 0
    if lost:
        write_text_atomic(state_file, json.dumps(state))
    return lost


def drop_damaged_errors(path: Path) -> None:
    """A trial's pickled error cut short (a full disk, a kill mid-write) would stop Tune from reading the experiment;
    without it Tune reads the same error from error.txt."""
    for pickled in path.glob("*/error.pkl"):
        try:
            with open(pickled, "rb") as f:
                pickle.load(f)
        except (EOFError, pickle.UnpicklingError):
            pickled.unlink()


SEARCH_STATES = ("search_gen_state-*.json", "searcher-state-*.pkl")  # pickles, whatever their names say


def refuse_damaged_state(path: Path) -> None:
    """The saved state Ray Tune restores a stage from, cut short by a kill mid-write (a sweep written before the
    storage wrote whole files: tuner/sweep/storage.py), is refused in one sentence: Tune would end in a bare
    "Aborted." (an empty tuner.pkl) or quietly start the stage again from nothing (a cut snapshot)."""
    snapshot = max(path.glob("experiment_state-*.json"), default=None)  # the newest: the one Tune restores
    pickled = [path / "tuner.pkl", *(max(path.glob(p), default=None) for p in SEARCH_STATES)]
    for f, whole in [(snapshot, _json_whole), *((p, _pickle_whole) for p in pickled)]:
        if f is not None and f.exists() and not whole(f):
            raise UserError(
                f"Cannot resume: {f} is cut short (the sweep was killed while Ray Tune wrote it); the trials in "
                f"{path} stay as they are, and the sweep run again with another --storage or --name starts anew."
            )


def _json_whole(f: Path) -> bool:
    try:
        json.loads(f.read_bytes())
    except ValueError:
        return False
    return True


def _pickle_whole(f: Path) -> bool:
    """Its opcodes walked to STOP, none executed."""
    try:
        for _ in pickletools.genops(f.read_bytes()):
            pass
    except ValueError:
        return False
    return True


@contextmanager
def stopping_cleanly(sweep_dir: Path) -> Iterator[Callable[[], bool]]:
    """Around a stage's Ray Tune runs: Ctrl-C and SIGTERM are `_ctrl_c`'s, a reserve is held in the storage, and a
    storage that fills or fails ends the stage in one sentence (`storage_failed`), what was written kept. Yields
    whether the stage may go on (no stop asked for, the storage whole)."""
    reserve = sweep_dir / RESERVE_FILE
    storage_failures.pop(str(reserve), None)
    main = threading.current_thread() is threading.main_thread()
    INTERRUPTED.clear()
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # Ctrl-C is _ctrl_c's, which asks Tune to stop in its stead
    previous = signal.signal(signal.SIGINT, _ctrl_c) if main else None
    try:
        reason = unwritable_reason(sweep_dir, STORAGE_RESERVE, keep_as=reserve)
        if reason:
            raise storage_failed(sweep_dir, reason)
        yield lambda: not INTERRUPTED.is_set() and str(reserve) not in storage_failures
    except Exception as e:  # the storage filled up or went away under Ray Tune's own writes, or a trial met it
        reason = storage_failures.pop(str(reserve), None) or (e.strerror if isinstance(e, OSError) else None)
        if reason is None or isinstance(e, UserError):
            raise
        raise storage_failed(sweep_dir, reason) from None
    finally:
        reserve.unlink(missing_ok=True)
        if main:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # Tune leaves this stage's handler behind
    if str(reserve) in storage_failures:
        raise storage_failed(sweep_dir, storage_failures.pop(str(reserve)))
