"""A run's folder: `config.yaml` (everything needed to rerun it), `metrics.parquet` (one row per round),
`checkpoint.pt` (the whole federated state, every `checkpoint_every` rounds and at the end) and `environment.json`
(where its rounds ran), each written whole or not at all (tuner/files.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol

import pandas as pd
import torch
import yaml

from tuner.errors import UserError
from tuner.files import write_atomic, write_text_atomic
from tuner.settings.config import RunConfig
from tuner.settings.tuned_files import checkout_commit


class Saved(Protocol):
    """What a run folder saves and loads: a Simulation, or one run of a pack."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


ENVIRONMENT_FILE = "environment.json"


def device_name(device: torch.device) -> str:
    """A device as a run's environment names it: the GPU's model, or the CPU and its cores."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"


def read_environment(folder: Path) -> list[dict]:
    """The environments a run's commands recorded (RunDir.record_environment), oldest first."""
    entries = json.loads((folder / ENVIRONMENT_FILE).read_text())
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{ENVIRONMENT_FILE} is not a list of environments")
    return entries


class RunDir:
    """The files of one run."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.metrics = self.path / "metrics.parquet"
        self.checkpoint = self.path / "checkpoint.pt"
        self.environment = self.path / ENVIRONMENT_FILE

    def record_environment(self, device: torch.device, from_round: int) -> None:
        """Where the rounds from `from_round` on run (the device by name, torch, the commit, "+changes" where the
        checkout differs from it), added to what earlier commands of this run recorded: a run resumed elsewhere
        says so, and the report carries it beside the run's figures."""
        entry = {
            "from_round": from_round,
            "device": device_name(device),
            "torch": torch.__version__,
            "commit": checkout_commit(),
        }
        kept = read_environment(self.path) if self.environment.exists() else []
        write_text_atomic(self.environment, json.dumps([*kept, entry], indent=1) + "\n")

    def write_config(self, cfg: RunConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.config, cfg.to_yaml())

    def read_config(self) -> RunConfig:
        if not self.config.exists():
            raise UserError(f"{self.path} holds no config.yaml, so there is no run to resume there.")
        return RunConfig(**yaml.safe_load(self.config.read_text()))

    def write_metrics(self, history: list[dict]) -> None:
        if history:
            write_atomic(self.metrics, lambda p: pd.DataFrame(history).to_parquet(p, index=False))

    def save(self, sim: Saved) -> None:
        write_atomic(self.checkpoint, lambda p: torch.save(sim.state_dict(), p))

    def saved_round(self) -> int | None:
        """The round of the checkpoint in this folder, or None where there is none that can be read."""
        try:
            return int(torch.load(self.checkpoint, weights_only=True)["round"])
        except Exception:  # none, or damaged: either way nothing to resume from
            return None

    def load(self, sim: Saved) -> None:
        if not self.checkpoint.exists():
            raise UserError(f"{self.path} holds no checkpoint.pt to resume from.")
        try:
            # tensors and numbers only: a checkpoint never runs code
            state = torch.load(self.checkpoint, weights_only=True)
        except Exception as e:  # unpickling a damaged file raises anything
            raise UserError(
                f"{self.checkpoint} cannot be read ({type(e).__name__}); the rows so far are in "
                f"{self.metrics}: rerun without --resume."
            ) from None
        sim.load_state_dict(state)
