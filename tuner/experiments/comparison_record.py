"""comparison.yaml, the record a tuned comparison (tuner/experiments/tuned_comparison.py) keeps as it goes, so that a
stopped one resumes with what it asked and says afterwards what ran where."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tuner.errors import UserError
from tuner.files import write_text_atomic
from tuner.settings.tuned_files import checkout_commit
from tuner.sweep.cluster import Resources


class Record:
    """comparison.yaml as the comparison goes: what was asked, the stages done, each cell's best as its search found
    it, the commits each stage ran at (one more at each resume from another), the wall time (over every command that
    ran it) and the trial slots, written as each stage starts and ends."""

    def __init__(self, path: Path, asked: dict, earlier: dict, slots: int) -> None:
        self.path, self.asked, self.slots = path, asked, slots
        self.wall, self.t0 = float(earlier.get("wall_s", 0.0)), time.monotonic()
        self.done: list[str] = list(earlier.get("done", []))
        self.found: dict[str, dict] = dict(earlier.get("best", {}))
        self.commits: dict[str, list[str]] = dict(earlier.get("commits", {}))

    @classmethod
    def resumed(cls, path: Path, asked: dict, res: Resources) -> Record:
        """The record a stopped comparison left, refused where it asked for other settings; Ray started, its slots
        counted."""
        import ray

        from tuner.sweep.cluster import start_ray, trial_resources, trial_slots

        earlier = yaml.safe_load(path.read_text()) if path.exists() else {}
        if earlier and earlier.get("asked") != asked:
            raise UserError(
                f"{path.parent} was started with other settings ({_first_change(earlier.get('asked') or {}, asked)}); "
                "resume it with the same options, or choose another --storage."
            )
        start_ray(res)
        record = cls(
            path, asked, earlier, trial_slots(trial_resources(res), res.max_concurrent, ray.cluster_resources())
        )
        record.note()
        return record

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A stage run: its commit recorded as it starts, the stage done once the body returns (a stop leaves it
        to do)."""
        at, here = self.commits.setdefault(name, []), checkout_commit()
        at += [here] if not at or at[-1] != here else []
        self.note()
        yield
        self.done.append(name)
        self.note()

    def commits_of(self, stage: str) -> str:
        """The commits `stage` ran at, as a provenance names them (the checkout's where none was recorded)."""
        return ", ".join(self.commits.get(stage, [])) or checkout_commit()

    def note(self) -> None:
        wall_s = self.wall + time.monotonic() - self.t0
        text = yaml.safe_dump(
            {
                "asked": self.asked,
                "wall_s": wall_s,
                "slots": self.slots,
                "done": self.done,
                "commits": self.commits,
                "best": self.found,
            },
            sort_keys=False,
        )
        write_text_atomic(self.path, text)


def _first_change(before: dict, now: dict) -> str:
    k = next((k for k in now if before.get(k) != now[k]), "settings")
    return f"{k}: {before.get(k)!r}, now {now[k]!r}"
