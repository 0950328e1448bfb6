"""The campaign's runs as `tuner run` processes on its device (what a trial does, without Tune): started or
resumed, waited for until a deadline and stopped as a scheduler would, and their figures read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def finished(run_dir: Path, rounds: int) -> bool:
    metrics = run_dir / "metrics.parquet"
    return metrics.exists() and pd.read_parquet(metrics)["round"].max() >= rounds


def tuner_run(args: list[str], campaign) -> subprocess.Popen | None:
    """A `tuner run` process on the campaign's device (no Ray: what a trial does, without Tune); its output goes to
    OUT.log.
    A run folder with a checkpoint (an earlier command's run, stopped by its budget) is resumed; one that an earlier
    command finished is not started again (None)."""
    run_dir = Path(args[args.index("--out") + 1])
    metrics = run_dir / "metrics.parquet"
    if metrics.exists() and pd.read_parquet(metrics)["round"].max() >= int(args[args.index("--rounds") + 1]):
        return None
    if (run_dir / "checkpoint.pt").exists():
        args = [args[0], "--resume", "--rounds", args[args.index("--rounds") + 1], "--out", str(run_dir)]
    extra = ["--set", f"device={campaign.device}"] + (["--set", f"data_dir={campaign.data}"] if campaign.data else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_name(run_dir.name + ".log")
    with open(log, "a") as out:  # the child keeps its own copy of the descriptor; a resumed run's log goes on
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "run", *args, *extra],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc.log = str(log)
    return proc


def wait_all(procs: list[subprocess.Popen], deadline: float) -> bool:
    """Wait for every process until the deadline; past it, stop them as a scheduler would (SIGTERM: rows are kept).
    True when all finished in time; a run that fails raises with the last line of its output."""
    procs = [p for p in procs if p is not None]  # runs finished by an earlier command
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    stopped = stop(procs)
    for p in procs:
        if p not in stopped:
            raise_if_failed(p)
    return not stopped


def wait_any(procs: list[subprocess.Popen], deadline: float) -> list[subprocess.Popen]:
    """The processes that have ended, as soon as one has (none: the deadline came first, or none was running)."""
    while procs and time.monotonic() < deadline:
        ended = [p for p in procs if p.poll() is not None]
        if ended:
            return ended
        time.sleep(0.5)  # runs take minutes: half a second late to start the next one costs nothing
    return []


def stop(procs: list[subprocess.Popen]) -> list[subprocess.Popen]:
    """SIGTERM to those still running, as a scheduler stops a trial (its rows are kept); returns them once ended."""
    stopped = [p for p in procs if p.poll() is None]
    for p in stopped:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait()
    return stopped


def raise_if_failed(p: subprocess.Popen) -> None:
    if p.returncode != 0:
        last = (Path(p.log).read_text().strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{' '.join(p.args[3:5])} exited with {p.returncode}: {last} (log: {p.log})")


def run_figures(run_dir: Path, finished: bool, seconds: float) -> dict:
    metrics = run_dir / "metrics.parquet"
    if not metrics.exists():
        return {
            "rounds": 0,
            "finished": False,
            "seconds": seconds,
            "s_per_round": float("nan"),
            "best_acc": float("nan"),
        }
    m = pd.read_parquet(metrics)
    return {
        "rounds": int(m["round"].max()),
        "finished": finished,
        "seconds": seconds,
        "s_per_round": float(m["time_s"].median()),
        "best_acc": float(m["acc"].max()),
        "final_acc": float(m["acc"].dropna().iloc[-1]),
        "dir": str(run_dir),
    }
