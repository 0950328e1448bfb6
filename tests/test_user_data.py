"""A user's own data: a Parquet file with or without its clients, nested folders of files, PFLlib's generated folders,
natural clients too small for their settings; every mistake in them one sentence."""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from cli_runs import invoke

from tuner.federated_run import build_simulation
from tuner.settings.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ["--dataset", "digits", "--partition", "iid", "--clients", "4", "--rounds", "1"]


def write_clients(path: Path, n=480, clients=6, with_split=True, seed=0, **overrides):
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    y = rng.integers(0, 4, n)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    x[np.arange(n), y] += 3.0
    columns = {"x": list(x), "y": y, "client": [f"hospital-{i % clients}" for i in range(n)]}
    if with_split:
        columns["split"] = np.where(np.arange(n) // clients % 4 == 0, "test", "train")  # a quarter of each client's
    columns.update(overrides)
    if path.suffix == ".npz":
        np.savez(path, **{k: np.stack(v) if k == "x" else np.asarray(v) for k, v in columns.items()})
    else:
        pd.DataFrame(columns).to_parquet(path)
    return path


def test_a_parquet_file_with_its_own_clients_runs_as_they_are(tmp_path):
    data = write_clients(tmp_path / "hospitals.parquet")
    res = invoke(
        "run", "fedavg", "--dataset", data, "--partition", "natural", "--rounds", "2", "--out", tmp_path / "run"
    )
    assert res.exit_code == 0, res.output
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cfg["clients"] == 6 and cfg["backbone"] == "mlp" and cfg["dataset"] == str(data)
    sim = build_simulation(RunConfig(**cfg))
    assert sim.data.train.counts == [60] * 6 and [len(y) for _, y in map(sim.data.test.client, range(6))] == [20] * 6
    assert len(pd.read_parquet(tmp_path / "run" / "metrics.parquet")) == 2


def test_a_file_without_clients_takes_any_partition_and_images_get_the_cnn(tmp_path):
    rng = np.random.default_rng(1)
    images = tmp_path / "images.npz"
    np.savez(images, x=rng.integers(0, 256, (300, 1, 16, 16), dtype=np.uint8), y=rng.integers(0, 3, 300))
    res = invoke(
        "run",
        "fedper",
        "--dataset",
        images,
        "--partition",
        "dir:0.5",
        "--clients",
        "3",
        "--rounds",
        "1",
        "--out",
        tmp_path / "run",
    )
    assert res.exit_code == 0, res.output
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["backbone"] == "cnn4"


def test_runs_over_files_in_nested_folders_are_reported_with_every_figure_named_by_the_files_stem(tmp_path):
    """Two sites' files of one name in different folders: each run's curves get a file of their own, named by
    the stem (a hash of the path tells the two apart), never by the absolute path."""
    for site, seed in (("north", 0), ("south", 1)):
        data = write_clients(tmp_path / "lab" / site / "deep folder" / "wine.parquet", seed=seed)
        res = invoke(
            "run",
            "fedper",
            "--dataset",
            data,
            "--partition",
            "natural",
            "--rounds",
            "2",
            "--out",
            tmp_path / "runs" / site,
        )
        assert res.exit_code == 0, res.output
    res = invoke("report", tmp_path / "runs", "--out", tmp_path / "report")
    assert res.exit_code == 0, res.output
    curves = sorted(p.name for p in (tmp_path / "report").glob("curves-*.png"))
    assert len(curves) == 2 and all(re.fullmatch(r"curves-wine-[0-9a-f]{6}-natural-6\.png", c) for c in curves), curves
    runs = pd.read_parquet(tmp_path / "report" / "runs.parquet")
    assert len(runs) == 2 and runs["selected_acc"].notna().all()
    res = invoke("report", tmp_path / "runs" / "north", "--out", tmp_path / "one")  # alone, the stem is enough
    assert res.exit_code == 0 and (tmp_path / "one" / "curves-wine-natural-6.png").exists(), res.output


def test_config_yaml_records_the_normalization_applied(tmp_path):
    features = write_clients(tmp_path / "features.parquet")
    images = tmp_path / "images.npz"
    np.savez(images, x=np.random.default_rng(0).integers(0, 256, (90, 1, 16, 16), dtype=np.uint8), y=np.arange(90) % 3)
    assert RunConfig(dataset=str(features)).resolved().normalize == "none"  # features are used as loaded
    assert RunConfig(dataset=str(images)).resolved().normalize == "half"  # bytes of images: PFLlib's default
    assert (
        RunConfig(dataset="har").resolved().normalize == "none"
        and RunConfig(dataset="digits").resolved().normalize == "half"
    )


def test_pfllibs_generated_folders_are_read_as_their_clients(tmp_path):
    rng = np.random.default_rng(2)
    sizes = {"train": [40, 70, 25], "test": [10, 20, 8]}
    for split, counts in sizes.items():
        (tmp_path / "Cifar" / split).mkdir(parents=True)
        for i, n in enumerate(counts):  # PFLlib's save_file: normalized float images, a pickled dict
            data = {"x": rng.normal(size=(n, 3, 8, 8)).astype(np.float32), "y": rng.integers(0, 10, n)}
            np.savez_compressed(tmp_path / "Cifar" / split / f"{i}.npz", data=data)
    cfg = RunConfig(method="fedavg", dataset=str(tmp_path / "Cifar"), partition="natural", rounds=1).resolved()
    assert cfg.clients == 3 and cfg.backbone == "mlp"  # 8x8 is too small for the CNN
    sim = build_simulation(replace(cfg.settings(), batch_size=5))
    assert sim.data.train.counts == sizes["train"]
    assert math.isfinite(sim.step()["train_loss"])


def sites(path: Path, small: int, split: bool, small_test: int = 0) -> Path:
    """Four sites of 80 rows and siteE with `small` training rows (and `small_test` test rows, where split)."""
    rng = np.random.default_rng(3)
    owners = [s for s in "ABCD" for _ in range(80)] + ["E"] * (small + small_test)
    is_test = [i % 4 == 0 for i in range(320)] + [False] * small + [True] * small_test
    y = rng.integers(0, 3, len(owners))
    x = rng.normal(size=(len(owners), 6)).astype(np.float32) + y[:, None]
    columns = {"x": list(x), "y": y, "client": [f"site{o}" for o in owners]}
    if split:
        columns["split"] = np.where(is_test, "test", "train")
    pd.DataFrame(columns).to_parquet(path)
    return path


def run_natural(data: Path, out: Path, *settings: str):
    return invoke(
        "run",
        "fedavg",
        "--dataset",
        data,
        "--partition",
        "natural",
        "--rounds",
        "1",
        "--out",
        out,
        *[a for s in settings for a in ("--set", s)],
    )


def test_a_client_never_scored_is_refused_by_its_own_name_and_the_advice_works(tmp_path):
    """A client with no test sample was left out of every mean without a word (the run said `clients 5`)."""
    res = run_natural(sites(tmp_path / "split.parquet", small=30, split=True), tmp_path / "a", "batch_size=10")
    assert (
        res.exit_code == 2
        and "1 clients have no test sample and would never be scored (client siteE); give those clients rows "
        "whose split is test"
        in " ".join(res.output.split())
    ), res.output
    res = run_natural(
        sites(tmp_path / "fixed.parquet", small=30, split=True, small_test=5), tmp_path / "b", "batch_size=10"
    )
    assert res.exit_code == 0, res.output  # the advice: test rows for siteE
    tiny = sites(tmp_path / "tiny.parquet", small=1, split=False)  # no split: 25 % of siteE's one row rounds to none
    res = run_natural(tiny, tmp_path / "c", "batch_size=1")
    assert res.exit_code == 2 and "(client siteE); leave such small clients out with --set min_samples=N" in " ".join(
        res.output.split()
    ), res.output
    res = run_natural(tiny, tmp_path / "d", "batch_size=1", "min_samples=2")
    assert res.exit_code == 0 and yaml.safe_load((tmp_path / "d" / "config.yaml").read_text())["clients"] == 4, (
        res.output
    )
    # siteE: 4 training rows, of which 10 % rounds to none
    small = sites(tmp_path / "small.parquet", small=6, split=False)
    res = run_natural(small, tmp_path / "e", "batch_size=3", "val_frac=0.1")
    assert (
        res.exit_code == 2
        and "no validation sample and would never be scored (client siteE); raise val_frac above 0.1"
        in " ".join(res.output.split())
    ), res.output
    assert run_natural(small, tmp_path / "f", "batch_size=3", "val_frac=0.2").exit_code == 0  # each advice, as given
    assert run_natural(small, tmp_path / "g", "batch_size=3", "val_frac=0.1", "min_samples=5").exit_code == 0


def test_a_natural_client_too_small_for_a_batch_gets_advice_that_works_there(tmp_path):
    data = sites(tmp_path / "sites.parquet", small=6, split=True, small_test=3)
    res = run_natural(data, tmp_path / "a", "batch_size=10")
    words = " ".join(res.output.split())
    assert (
        res.exit_code == 2
        and "1 of its 5 clients have fewer training samples than one batch of 10 (the fewest: client siteE, 6)" in words
    ), res.output
    assert (
        "use batch_size=6 or less, or leave such clients out with --set min_samples=10" in words
        and "fewer clients" not in words
    )
    assert run_natural(data, tmp_path / "b", "batch_size=6").exit_code == 0  # each advice, as given
    res = run_natural(data, tmp_path / "c", "batch_size=10", "min_samples=10")
    assert res.exit_code == 0 and yaml.safe_load((tmp_path / "c" / "config.yaml").read_text())["clients"] == 4, (
        res.output
    )
    res = invoke(
        "run",
        "fedavg",
        "--dataset",
        data,
        "--partition",
        "natural",
        "--clients",
        "5",
        "--set",
        "min_samples=10",
        "--out",
        tmp_path / "d",
    )
    assert (
        res.exit_code == 2
        and "holds 4 clients (1 of its 5 have fewer than min_samples=10 training samples)"
        in " ".join(res.output.split())
    )


def pfllib_folder(root: Path, clients: list[int], config: dict | None = None, text: bool = False) -> Path:
    """A folder as PFLlib's generators write it (save_file): train/ and test/ per-client files, config.json beside."""
    rng = np.random.default_rng(4)
    for split in ("train", "test"):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in clients:
            x = (
                [(rng.integers(1, 50, 8), 8) for _ in range(12)]
                if text
                else rng.normal(size=(12, 6)).astype(np.float32)
            )
            np.savez_compressed(root / split / f"{i}.npz", data={"x": x, "y": np.arange(12) % 3})
    if config is not None:
        (root / "config.json").write_text(json.dumps({"non_iid": True, "balance": False, "partition": "dir", **config}))
    return root


PFLLIB_MISTAKES = {  # what the folder holds, config.json, the sentence
    "a client file missing from both splits": (
        [0, 1, 2, 3],
        {"num_clients": 5, "num_classes": 3},
        "train/ lacks 4.npz (config.json says 5 clients)",
    ),
    "a gap in the numbering": (
        [0, 1, 2, 3, 7],
        None,
        "train/ lacks 4.npz, 5.npz, 6.npz (clients are numbered 0 ... 7)",
    ),
    "more files than config.json says": (
        [0, 1, 2],
        {"num_clients": 2, "num_classes": 3},
        "config.json says 2 clients, but it holds 2.npz",
    ),
    "classes config.json does not hold": (
        [0, 1],
        {"num_clients": 2, "num_classes": 12},
        "config.json says num_classes 12, but the clients' labels run 0 ... 2 (3 classes)",
    ),
}


@pytest.mark.parametrize("mistake", list(PFLLIB_MISTAKES))
def test_a_pfllib_folder_is_checked_against_its_config_json_in_one_sentence(tmp_path, mistake):
    clients, config, words = PFLLIB_MISTAKES[mistake]
    res = invoke(
        "run",
        "fedavg",
        "--dataset",
        pfllib_folder(tmp_path / "data", clients, config),
        "--partition",
        "natural",
        "--out",
        tmp_path / "run",
    )
    assert res.exit_code == 2 and words in " ".join(res.output.split()), res.output


def test_a_pfllib_folder_whose_config_json_agrees_runs_and_text_is_refused_in_one_sentence(tmp_path):
    data = pfllib_folder(tmp_path / "ok", [0, 1, 2], {"num_clients": 3, "num_classes": 3})
    res = invoke(
        "run",
        "fedavg",
        "--dataset",
        data,
        "--partition",
        "natural",
        "--rounds",
        "1",
        "--set",
        "batch_size=4",
        "--out",
        tmp_path / "run",
    )
    assert res.exit_code == 0 and yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["clients"] == 3, (
        res.output
    )
    text = pfllib_folder(tmp_path / "news", [0, 1], {"num_clients": 2, "num_classes": 3}, text=True)
    res = invoke("run", "fedavg", "--dataset", text, "--partition", "natural", "--out", tmp_path / "run2")
    assert (
        res.exit_code == 2
        and "holds PFLlib's text format (each x a (tokens, length) pair), which is not read"
        in " ".join(res.output.split())
    ), res.output


DATA_MISTAKES = {
    "labels not integers": (dict(y=np.full(480, 0.5)), [], "integer class labels"),
    "labels as words": (dict(y=["cat"] * 480), [], "integer class labels"),
    "NaN in x": (dict(x=[np.full(12, np.nan)] * 480), [], "NaN"),
    "shapes that differ": (
        dict(x=[np.zeros(12 if i else 5) for i in range(480)]),
        [],
        "every sample must have one shape",
    ),
    "a split of other values": (dict(split=["train", "validation"] * 240), [], "split holds 'validation'"),
    "a client without training samples": (
        dict(split=["test" if i % 6 == 5 else "train" for i in range(480)]),
        ["--partition", "natural"],
        "client hospital-5 has no training samples",
    ),
    "clients that contradict the data": ({}, ["--partition", "natural", "--clients", "4"], "holds 6 clients"),
}


@pytest.mark.parametrize("mistake", list(DATA_MISTAKES))
def test_mistaken_data_is_one_sentence(tmp_path, mistake):
    columns, args, words = DATA_MISTAKES[mistake]
    data = write_clients(tmp_path / "data.parquet", **columns)
    res = invoke(
        "run",
        "fedavg",
        "--dataset",
        data,
        *(args or ["--partition", "iid", "--clients", "3"]),
        "--rounds",
        "1",
        "--out",
        tmp_path / "run",
    )
    assert res.exit_code == 2 and words in res.output, res.output


def test_other_data_mistakes_are_one_sentence(tmp_path):
    plain = tmp_path / "plain.npz"
    np.savez(plain, x=np.zeros((60, 4), np.float32), y=np.arange(60) % 3)
    (tmp_path / "half" / "train").mkdir(parents=True)
    cases = [
        (["--dataset", tmp_path / "missing.parquet"], "does not exist"),
        (["--dataset", plain, "--partition", "natural"], "has no client column"),
        (["--dataset", "digits", "--partition", "natural"], "digits names none"),
        (["--dataset", tmp_path / "half"], "not a PFLlib dataset"),
        (["--dataset", tmp_path / "broken.parquet"], "cannot be read as Parquet"),
    ]
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    for args, words in cases:
        res = invoke("run", "fedavg", *args, "--rounds", "1", "--out", tmp_path / "run")
        assert res.exit_code == 2 and words in res.output, (args, res.output)
    # a backbone without BatchNorm
    res = invoke("run", f"{ROOT}/examples/fedbn.py:FedBN", *DIGITS, "--out", tmp_path / "run")
    assert res.exit_code == 2 and "has none" in res.output, res.output


def test_the_own_data_example_space_sweeps_any_method_over_the_sites_file(tmp_path, monkeypatch):
    """docs/own_code.md's worked example: make_sites.py's file, read through a space with no method."""
    import runpy

    from tuner.sweep.space_file import load_space

    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(ROOT / "examples" / "make_sites.py"))
    for method in ("fedavg", "fedper"):
        cfg = load_space(ROOT / "examples" / "sites.yaml", method).base_config()
        assert (cfg.method, cfg.dataset, cfg.clients, cfg.normalize, cfg.val_frac) == (
            method,
            str(tmp_path / "sites.parquet"),
            6,
            "none",
            0.1,
        )
    data = build_simulation(replace(cfg.settings(), rounds=1)).data
    assert [int((c > 0).sum()) for c in data.label_counts()] == [2] * 6  # each site sees two of the four classes
