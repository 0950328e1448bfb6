"""The bad-input battery: a user's mistakes across every command, each ending with one sentence, its
exit code, no traceback, and in bounded time (none waits on Ray or a download)."""

import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tuner.cli import app
from tuner.files import LOCK_FILE

ROOT = Path(__file__).resolve().parents[1]
SENTENCE_BREAK = re.compile(r"[.!?] [A-Z]")  # a sentence ends and another begins
DEMO = str(ROOT / "search_spaces" / "demo.yaml")
DIGITS = ["--dataset", "digits", "--partition", "iid", "--clients", "4", "--rounds", "1"]

# (what the user did, the command line ({w}: a workspace the fixture fills), exit code, words of the sentence)
MISTAKES = [
    ("run: an unknown method", ["run", "fedmagic", *DIGITS], 2, "Unknown method 'fedmagic'"),
    ("run: an unknown dataset", ["run", "fedavg", "--dataset", "imagenet"], 2, "Unknown dataset 'imagenet'"),
    (
        "run: an unknown setting",
        ["run", "fedavg", *DIGITS, "--set", "lamda=1"],
        2,
        "'lamda' is not a setting of fedavg",
    ),
    ("run: a word for a number", ["run", "fedavg", *DIGITS, "--set", "lr=fast"], 2, "lr must be a float"),
    ("run: --set without =", ["run", "fedavg", *DIGITS, "--set", "lr"], 2, "must look like name=value"),
    ("run: a join ratio above 1", ["run", "fedavg", *DIGITS, "--set", "join_ratio=2"], 2, "join_ratio '2'"),
    (
        "run: more classes per client than exist",
        ["run", "fedavg", "--dataset", "digits", "--partition", "pat:11"],
        2,
        "11 classes per client",
    ),
    (
        "run: more clients than the data allows",
        ["run", "fedavg", "--dataset", "digits", "--partition", "dir:0.1", "--clients", "60"],
        2,
        "fewer clients",
    ),
    (
        "run: a partition name misspelt",
        ["run", "fedavg", "--dataset", "digits", "--partition", "dirichlet"],
        2,
        "not understood",
    ),
    ("run: a backbone the images do not fit", ["run", "fedavg", *DIGITS, "--set", "backbone=cnn4"], 2, "backbone=mlp"),
    ("run: an unknown backbone", ["run", "fedavg", *DIGITS, "--set", "backbone=vit"], 2, "Unknown backbone 'vit'"),
    (
        "run: a CIFAR-10 download cut short",
        ["run", "fedavg", "--dataset", "cifar10", "--set", "data_dir={w}/cifar", "--set", "download=false"],
        2,
        "No whole cifar10 at",
    ),
    (
        "run: data that is not there",
        ["run", "fedavg", "--dataset", "cifar10", "--set", "data_dir=/nonexistent", "--set", "download=false"],
        2,
        "/nonexistent/cifar-10-batches-py (dataset not found or corrupted); pass --set data_dir=FOLDER",
    ),
    (
        "run: a run folder in use by another run",
        ["run", "fedavg", *DIGITS, "--out", "{w}/busy-run"],
        2,
        "The run folder {w}/busy-run is in use by process",
    ),
    (
        "run: zero rounds",
        ["run", "fedavg", "--dataset", "digits", "--rounds", "0"],
        2,
        "--rounds: Setting rounds must be at least 1, not 0",
    ),
    (
        "run: zero clients",
        ["run", "fedavg", "--dataset", "digits", "--clients", "0"],
        2,
        "--clients: Setting clients must be at least 1, not 0",
    ),
    (
        "run: zero clients in a config file",
        ["run", "fedavg", "--config", "{w}/zero-clients.yaml"],
        2,
        "zero-clients.yaml: Setting clients must be at least 1, not 0",
    ),
    ("run: --set with no value", ["run", "fedavg", *DIGITS, "--set", "lr="], 2, "--set 'lr=' gives lr no value"),
    (
        "run: a uniform share above 100 %",
        ["run", "fedavg", "--dataset", "digits", "--partition", "pac:101"],
        2,
        "pac's value must be the uniform share in %, from 0 to 100, not 101",
    ),
    (
        "run: --resume with zero rounds",
        ["run", "fedavg", "--resume", "--rounds", "0", "--out", "{w}/done"],
        2,
        "--rounds must be at least 1, not 0",
    ),
    (
        "run: --resume with no rounds left",
        ["run", "fedavg", "--resume", "--rounds", "1", "--out", "{w}/done"],
        2,
        "has run 1 rounds already; --rounds is the new total: give more than 1",
    ),
    (
        "run: labels numbered from 1",
        ["run", "fedavg", "--dataset", "{w}/from-one.parquet"],
        2,
        "y's labels are 1, 2, 3, with no sample of class 0",
    ),
    (
        "run: a normalization features do not take",
        ["run", "fedavg", "--dataset", "{w}/from-one-fixed.parquet", "--set", "normalize=half"],
        2,
        "normalize half applies to images stored as bytes",
    ),
    ("run: a negative learning rate", ["run", "fedavg", *DIGITS, "--set", "lr=-0.1"], 2, "lr must be positive"),
    (
        "run: a learning rate that is not a number",
        ["run", "fedavg", *DIGITS, "--set", "lr=.nan"],
        2,
        "Setting lr must be a finite number, not nan",
    ),
    (
        "run: a negative seed",
        ["run", "fedavg", *DIGITS, "--set", "seed=-1"],
        2,
        "Setting seed cannot be negative, not -1",
    ),
    ("run: a GPU on a machine without one", ["run", "fedavg", *DIGITS, "--set", "device=cuda"], 2, "has no CUDA GPU"),
    ("run: an unknown float type", ["run", "fedavg", *DIGITS, "--set", "dtype=float16"], 2, "Unknown dtype"),
    ("run: an unknown executor", ["run", "fedavg", *DIGITS, "--set", "executor=magic"], 2, "Unknown executor"),
    (
        "run: an unknown engine",
        ["run", "fedavg", *DIGITS, "--set", "engine=turbo"],
        2,
        "Unknown engine 'turbo'; choose one of auto, eager, compiled",
    ),
    (
        "run: a batch larger than a client's data",
        ["run", "fedavg", *DIGITS, "--set", "batch_size=5000"],
        2,
        "have fewer training samples than one batch of 5000",
    ),
    ("run: a hyperparameter out of range", ["run", "fedavg", *DIGITS, "--set", "momentum=-1"], 2, "cannot be negative"),
    ("run: --resume where nothing ran", ["run", "fedavg", "--resume", "--out", "{w}/nothing"], 2, "no config.yaml"),
    (
        "run: an output folder that holds a run",
        ["run", "fedavg", *DIGITS, "--out", "{w}/done"],
        2,
        "holds a run already; pass --resume to continue it, or choose another --out",
    ),
    (
        "run: --resume without the folder",
        ["run", "fedavg", "--resume"],
        2,
        "--resume continues the run in the folder --out names",
    ),
    ("run: a config file that is not there", ["run", "fedavg", "--config", "{w}/missing.yaml"], 2, "does not exist"),
    (
        "run: a config file that is not YAML",
        ["run", "fedavg", "--config", "{w}/bad.yaml"],
        2,
        "is not valid YAML at line",
    ),
    ("run: a method file that is not there", ["run", "{w}/nothing.py:FedNew", *DIGITS], 2, "does not exist"),
    (
        "run: a dataset file that is not there",
        ["run", "fedavg", "--dataset", "{w}/missing.parquet"],
        2,
        "does not exist",
    ),
    (
        "run: a natural partition of a built-in dataset",
        ["run", "fedavg", "--dataset", "digits", "--partition", "natural"],
        2,
        "digits names none",
    ),
    (
        "run: an output folder inside a file",
        ["run", "fedavg", *DIGITS, "--out", "{w}/a-file/run"],
        2,
        "Cannot write to the run folder",
    ),
    (
        "sweep: --study-db naming a folder",
        ["sweep", "gpfl", "--space", DEMO, "--storage", "{w}/s", "--study-db", "{w}/empty-folder"],
        2,
        "empty-folder is a folder; name a file",
    ),
    (
        "sweep: --study-db that is not SQLite",
        ["sweep", "gpfl", "--space", DEMO, "--storage", "{w}/s", "--study-db", "{w}/bad.yaml"],
        2,
        "cannot be opened as an SQLite file",
    ),
    ("sweep: a space file that is not there", ["sweep", "gpfl", "--space", "{w}/missing.yaml"], 2, "does not exist"),
    (
        "sweep: a space file with an unknown key",
        ["sweep", "gpfl", "--space", "{w}/typo.yaml"],
        2,
        "unknown key 'serach'",
    ),
    ("sweep: another method's space", ["sweep", "fedavg", "--space", DEMO], 2, "is a space for gpfl, not fedavg"),
    (
        "sweep: a space that searches nothing",
        ["sweep", "fedavg", "--space", "{w}/empty.yaml"],
        2,
        "names no setting to search",
    ),
    (
        "sweep: a float range for a whole-number setting",
        ["sweep", "fedavg", "--space", "{w}/float-batch.yaml", "--storage", "{w}/s"],
        2,
        "search.batch_size = 28.72: Setting batch_size must be an int",
    ),
    (
        "sweep: a YAML number without a decimal point",
        ["sweep", "fedavg", "--space", "{w}/yaml-number.yaml", "--storage", "{w}/s"],
        2,
        "[low, high], two numbers, not ['1e-4', 1]; YAML reads 1e-4 as text: write it 1.0e-04",
    ),
    (
        "sweep: a name in use by a running sweep",
        ["sweep", "gpfl", "--space", DEMO, "--storage", "{w}/busy", "--resume"],
        2,
        "The sweep {w}/busy/gpfl-demo is in use by process",
    ),
    (
        "sweep: a distribution that makes bad runs",
        ["sweep", "fedavg", "--space", "{w}/negative.yaml"],
        2,
        "lr must be positive",
    ),
    (
        "sweep: an unknown sampler typed",
        ["sweep", "gpfl", "--space", DEMO, "--sampler", "bayes", "--storage", "{w}/s"],
        2,
        "--sampler: unknown sampler 'bayes'",
    ),
    (
        "sweep: no samples typed",
        ["sweep", "gpfl", "--space", DEMO, "--samples", "0", "--storage", "{w}/s"],
        2,
        "--samples must be a whole number of at least 1, not 0",
    ),
    (
        "sweep: an unknown selection typed",
        ["sweep", "gpfl", "--space", DEMO, "--select", "best", "--storage", "{w}/s"],
        2,
        "--select must be test or val, not 'best'",
    ),
    (
        "sweep: a grace beyond the rounds typed",
        ["sweep", "gpfl", "--space", DEMO, "--grace", "100", "--storage", "{w}/s"],
        2,
        "--grace (100) exceeds the run's 15 rounds",
    ),
    (
        "sweep: zero patience typed",
        ["sweep", "gpfl", "--space", DEMO, "--patience", "0", "--storage", "{w}/s"],
        2,
        "--patience must be a whole number of at least 1, not 0",
    ),
    (
        "sweep: zero rounds with --set",
        ["sweep", "gpfl", "--space", DEMO, "--set", "rounds=0", "--storage", "{w}/s"],
        2,
        "--set: Setting rounds must be at least 1, not 0",
    ),
    (
        "sweep: zero rounds in the space file",
        ["sweep", "gpfl", "--space", "{w}/zero-rounds.yaml", "--storage", "{w}/s"],
        2,
        "zero-rounds.yaml: settings: Setting rounds must be at least 1, not 0",
    ),
    (
        "sweep: negative GPUs",
        ["sweep", "gpfl", "--space", DEMO, "--gpus-per-trial", "-1", "--storage", "{w}/s"],
        2,
        "--gpus-per-trial must be 0",
    ),
    (
        "sweep: zero CPUs",
        ["sweep", "gpfl", "--space", DEMO, "--cpus-per-trial", "0", "--storage", "{w}/s"],
        2,
        "--cpus-per-trial must be positive",
    ),
    (
        "sweep: negative seeds",
        ["sweep", "gpfl", "--space", DEMO, "--seeds", "-1", "--storage", "{w}/s"],
        2,
        "--seeds must be 0 or more",
    ),
    (
        "sweep: storage inside a file",
        ["sweep", "gpfl", "--space", DEMO, "--storage", "{w}/a-file"],
        2,
        "Cannot write to the sweep's storage",
    ),
    (
        "sweep: a cluster that is not there",
        ["sweep", "gpfl", "--space", DEMO, "--address", "127.0.0.1:1", "--storage", "{w}/s"],
        2,
        "No Ray cluster answers",
    ),
    ("report: a folder that is not there", ["report", "{w}/nothing"], 2, "does not exist"),
    ("report: a folder without runs", ["report", "{w}/empty-folder"], 2, "No readable runs"),
    ("report: only damaged runs", ["report", "{w}/damaged-run"], 2, "1 unreadable"),
    (
        "report: --out inside a file",
        ["report", "{w}/done", "--out", "{w}/a-file/report"],
        2,
        "a folder on that path does not exist or is not a folder: fix the path",
    ),
    (
        "report: an unknown selection",
        ["report", "{w}/empty-folder", "--select", "best"],
        2,
        "--select must be test or val",
    ),
    ("reproduce: an unknown table", ["reproduce", "gpfl-table99"], 2, "Unknown table 'gpfl-table99'"),
    ("reproduce: no seed", ["reproduce", "gpfl-table1", "--seeds", "0"], 2, "--seeds must be at least 1"),
    ("reproduce: zero rounds", ["reproduce", "gpfl-table1", "--rounds", "0"], 2, "--rounds must be at least 1, not 0"),
    (
        "reproduce: no data for any cell",
        ["reproduce", "gpfl-table1", "--dataset", "cifar10", "--set", "data_dir=/nonexistent"],
        2,
        "can run here",
    ),
    (
        "data show: an unknown dataset",
        ["data", "show", "--dataset", "imagenet", "--out", "{w}/p.png"],
        2,
        "Unknown dataset 'imagenet'",
    ),
    (
        "data show: zero clients",
        ["data", "show", "--dataset", "digits", "--clients", "0", "--out", "{w}/p.png"],
        2,
        "--clients: Setting clients must be at least 1, not 0",
    ),
    (
        "data show: an impossible partition",
        ["data", "show", "--dataset", "digits", "--partition", "pat:11", "--out", "{w}/p.png"],
        2,
        "11 classes per client",
    ),
    (
        "data show: --out naming a folder",
        ["data", "show", "--dataset", "digits", "--partition", "iid", "--clients", "4", "--out", "{w}/empty-folder"],
        2,
        "empty-folder (Is a directory)",
    ),
    ("methods: a template name with spaces", ["methods", "--template", "Fed New"], 2, "must be lower case letters"),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    w = tmp_path_factory.mktemp("mistakes")
    (w / "a-file").write_text("not a folder")
    (w / "bad.yaml").write_text("dataset: digits\nrounds: [1,\n")
    (w / "typo.yaml").write_text("settings: {dataset: digits}\nserach:\n  lr: {loguniform: [0.001, 0.1]}\n")
    (w / "empty.yaml").write_text("settings: {dataset: digits}\n")
    (w / "negative.yaml").write_text("settings: {dataset: digits, clients: 4}\nsearch:\n  lr: {uniform: [-0.1, 0.1]}\n")
    (w / "empty-folder").mkdir()
    (w / "float-batch.yaml").write_text(
        "settings: {dataset: digits, clients: 4}\nsearch:\n  batch_size: {uniform: [8, 64]}\n"
    )
    (w / "yaml-number.yaml").write_text(
        "settings: {dataset: digits, clients: 4}\nsearch:\n  lr: {loguniform: [1e-4, 1]}\n"
    )
    for busy in (w / "busy" / "gpfl-demo", w / "busy-run"):  # held by a live process: this one
        (busy / "search").mkdir(parents=True)
        (busy / LOCK_FILE).write_text(f"{socket.gethostname()} {os.getpid()}")
    damaged = w / "damaged-run"
    damaged.mkdir()
    (damaged / "config.yaml").write_text("method: fedavg\ndataset: digits\n")
    (damaged / "metrics.parquet").write_bytes(b"PAR1 cut short")
    cut = w / "cifar" / "cifar-10-batches-py"  # a download cut short: one batch, half of it
    cut.mkdir(parents=True)
    (cut / "data_batch_1").write_bytes(b"\x80\x04\x95 half a pickle")
    (w / "zero-clients.yaml").write_text("dataset: digits\nclients: 0\n")
    (w / "zero-rounds.yaml").write_text(
        "method: gpfl\nsettings: {dataset: digits, rounds: 0}\nsearch:\n  lam: {loguniform: [0.0001, 1]}\n"
    )
    rng = np.random.default_rng(0)
    for name, first in (("from-one", 1), ("from-one-fixed", 0)):
        pd.DataFrame(
            {"x": list(rng.normal(size=(60, 4))), "y": first + np.arange(60) % 3, "client": np.arange(60) % 3}
        ).to_parquet(w / f"{name}.parquet")
    # a finished run to resume
    assert CliRunner().invoke(app, ["run", "fedavg", *DIGITS, "--out", str(w / "done")]).exit_code == 0
    return w


@pytest.mark.parametrize("what, args, code, words", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_is_one_sentence(workspace, what, args, code, words, monkeypatch):
    monkeypatch.chdir(workspace)  # default output folders (results/runs/METHOD-TIME) land here, not in the repository
    start = time.monotonic()
    res = CliRunner().invoke(app, [a.format(w=workspace) for a in args])
    words = words.format(w=workspace)
    assert time.monotonic() - start < 60  # never a wait on Ray, a download or a hang
    assert res.exit_code == code, res.output
    assert words in " ".join(res.output.split()) and "Traceback" not in res.output, res.output
    assert len([line for line in res.output.splitlines() if line.startswith("error:")]) == 1
    said = " ".join(res.output[res.output.index("error:") + len("error:") :].split())
    assert said.endswith(".") and not SENTENCE_BREAK.search(said), f"not one sentence: {said}"
    runs = workspace / "results" / "runs"
    assert not runs.exists() or all(any(d.iterdir()) for d in runs.iterdir())  # a refused run leaves no empty folder


def test_the_battery_is_broad():
    commands = {m[1][0] for m in MISTAKES}
    assert len(MISTAKES) >= 35 and commands == {"run", "sweep", "report", "reproduce", "data", "methods"}


def test_the_readme_states_the_batterys_size():
    assert f"**{len(MISTAKES)} user mistakes**" in (ROOT / "README.md").read_text()


def test_a_failed_read_or_write_names_its_cause():
    """A missing folder is not a full disk (a report once blamed disk space for a file name it had made wrong)."""
    import errno

    from tuner.cli.common import io_advice

    assert io_advice(OSError(errno.ENOSPC, "No space left on device", "f")) == "free space or choose another folder"
    assert "does not exist" in io_advice(FileNotFoundError(errno.ENOENT, "No such file or directory", "f"))
    assert io_advice(PermissionError(errno.EACCES, "Permission denied", "f")) == "choose a folder you may write to"
