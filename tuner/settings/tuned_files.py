"""Tuned settings as files: a method's best configuration from a tuned comparison (`tuner reproduce --tune`), a run
configuration with where it came from, in `results/tuned/SETTING/METHOD.yaml`; `tuner run METHOD --tuned SETTING`
runs it.

A file holds `settings` (the names `--set` takes: the data setting, rounds, and the tuned hyperparameters) and
`provenance` (the table, the space file and its hash, the search's sampler, seed and trials, the rounds it trained,
the validation score that chose, the fresh seeds' test accuracy and the commit).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import UserError
from tuner.files import load_yaml, write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
TUNED_DIR = Path("results/tuned")  # under the current directory, as every other results folder
DATA_SETTINGS = ("dataset", "partition", "clients", "join_ratio", "backbone")  # what makes a setting another one


def setting_name(settings: dict[str, Any]) -> str:
    """A data setting's folder name: fmnist-dir0.1-20c-cnn4 (a data file of one's own by its stem)."""
    dataset = Path(str(settings["dataset"])).stem
    partition = str(settings["partition"]).replace(":", "")
    name = f"{dataset}-{partition}-{settings['clients']}c-{settings['backbone']}"
    join = str(settings.get("join_ratio", "1"))
    return name if join in ("1", "1.0") else f"{name}-join{join}"


def checkout_commit() -> str:
    """The checkout's commit, with "+changes" where its tracked files differ from it ("" outside a git checkout)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def changed_space(tuned_file: str | Path) -> str | None:
    """A sentence where the space file a tuned file was searched from has changed since (its hash differs), so the
    settings may no longer be that space's best; None where it is unchanged or not here to compare."""
    provenance = (load_yaml(Path(tuned_file)) or {}).get("provenance") or {}
    space, recorded = provenance.get("space"), provenance.get("space_sha256")
    if not space or not recorded or not Path(space).is_file() or file_hash(Path(space)) == recorded:
        return None
    return (
        f"Note: {space} has changed since {tuned_file} was tuned from it (its hash was {recorded}); these settings "
        "are that search's best, not necessarily the current space's."
    )


def write_tuned(folder: Path, method: str, settings: dict[str, Any], provenance: dict[str, Any]) -> Path:
    """`folder`/SETTING/METHOD.yaml, replacing an earlier one (the newest comparison's best)."""
    path = folder / setting_name(settings) / f"{method}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"method": method, "settings": settings, "provenance": provenance}, sort_keys=False)
    write_text_atomic(path, text)
    return path


def tuned_settings(folder: Path = TUNED_DIR) -> dict[str, list[str]]:
    """Each method's tuned settings under `folder`, by name."""
    out: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*/*.yaml")) if folder.is_dir() else []:
        out.setdefault(path.stem, []).append(path.parent.name)
    return out


def read_tuned(method: str, setting: str, typed: dict[str, Any], folder: Path = TUNED_DIR) -> tuple[str, dict]:
    """The settings tuned for `method` at `setting` (a name under `folder`, or a folder of one's own), checked
    against the data settings typed beside them; returns (the file, its settings)."""
    where = Path(setting).expanduser()
    path = (where if where.is_dir() else folder / setting) / f"{method}.yaml"
    if not path.exists():
        have = tuned_settings(folder).get(method, [])
        listed = f"it has tuned settings for {', '.join(have)}" if have else "none are tuned for it yet"
        raise UserError(
            f"No tuned settings for {method} at {setting!r} ({path} does not exist): {listed}; tune one with "
            "`tuner reproduce TABLE --tune` (docs/tuned.md)."
        )
    data = load_yaml(path)
    settings = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(settings, dict):
        raise UserError(f"{path} holds no `settings` mapping; write it again with `tuner reproduce TABLE --tune`.")
    clash = [k for k in DATA_SETTINGS if typed.get(k) is not None and str(typed[k]) != str(settings.get(k))]
    if clash:
        k = clash[0]
        raise UserError(
            f"{path} was tuned with {k}={settings.get(k)}, not {typed[k]}; drop the {k} you typed, or pick a "
            f"setting tuned for it: {', '.join(tuned_settings(folder).get(method, [])) or 'none yet'}."
        )
    from tuner.plugins import family_settings, method_class

    moved = {k: v for k, v in family_settings(method_class(method)).items() if k in settings and settings[k] != v}
    if moved:
        k, v = next(iter(moved.items()))
        raise UserError(
            f"{path} sets {k}={settings[k]}, but {method} is the method with {k}={v} (the setting tells its variants "
            "apart): it was tuned before a comparison kept each variant's settings; tune it again with "
            "`tuner reproduce TABLE --tune`."
        )
    return str(path), settings
