"""Where a bench's figures came from, written beside them: the command, the commit, the machine and torch."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a source checkout, with or without PYTHONPATH=.

from tuner.settings.tuned_files import checkout_commit as commit  # noqa: E402


def machine() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores"
    return (
        f"CPU ({platform.processor() or platform.machine()}), {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads"
    )


def write(path: str | Path, figures: dict) -> None:
    """The figures as JSON at `path`, with the command that made them, the commit, the machine, torch and the date."""
    import torch

    record = {
        "command": " ".join(["python", *sys.argv]),
        "commit": commit(),
        "machine": machine(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "figures": figures,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2, default=str) + "\n")
