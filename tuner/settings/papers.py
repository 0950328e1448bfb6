"""The papers this tool reproduces, in one catalogue.

Each paper's training protocol and rounds, the methods it proposes, its tables (which figure each
reports, and where the paper says so), its names for datasets and partitions, the replication
report's name for its own run of FedPAC, and the shared experiment settings that search spaces
name. The published numbers themselves are `results/paper_tables.csv`, one row per method and
cell. Read by tuner/settings/config.py (a method's home protocol), tuner/experiments/reproduce.py (the cells to run)
and tuner/report/tables.py (cells matched to runs, labels); the protocols' values are tuner/settings/defaults.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tuner.data.partition import parse_partition

PUBLISHED = Path(__file__).resolve().parents[2] / "results" / "paper_tables.csv"


@dataclass(frozen=True)
class Paper:
    protocol: str  # the training protocol every method of its tables runs under (tuner/settings/defaults.py)
    rounds: int  # global rounds of its tables
    proposes: tuple[str, ...] = ()  # its own methods: run alone, they default to its protocol


@dataclass(frozen=True)
class Table:
    paper: str
    name: str  # as in paper_tables.csv
    reported: str  # the figure it reports: the best round ("best", following pFedMe) or the last ("final")
    source: str  # where the paper says so
    main: bool = False  # a main comparison: baselines it did not run are printed beside it; ablations never


PAPERS = {
    "GPFL": Paper("pfllib", 2000, ("gpfl",)),
    "FedCP": Paper("pfllib", 2000, ("fedcp",)),
    "FedPAC": Paper("fedpac", 200, ("fedpac",)),
    "FedPAC-replication": Paper("fedpac", 200),  # the replication report reran FedPAC's Table 1 setting
}
BEST_GPFL = "§4.1: the best mean personalized test accuracy over rounds (following pFedMe), evaluated every round"
BEST_FEDCP = "§4: the average test accuracy of the best personalized models (following pFedMe)"
TABLES = {
    "gpfl-table1": Table("GPFL", "Table1", "best", BEST_GPFL, main=True),
    "gpfl-table4": Table("GPFL", "Table4-stability", "best", "§4.1: the same protocol as Table 1"),
    "gpfl-table6": Table("GPFL", "Table6-ablation", "best", "§4.1: the same protocol as Table 1"),
    "fedcp-table1": Table("FedCP", "Table1-ablation", "best", BEST_FEDCP),
    "fedcp-table2": Table("FedCP", "Table2", "best", BEST_FEDCP, main=True),
    "fedcp-table4": Table("FedCP", "Table4-scalability", "best", "§4: the same protocol as Table 2"),
    "fedcp-table7": Table("FedCP", "Table7-stability", "best", "§4: the same protocol as Table 2"),
    "fedpac-table1": Table(
        "FedPAC",
        "Table1",
        "final",
        "Table 1 caption: the comparison of final test accuracy, after 200 rounds (B.3)",
        main=True,
    ),
    "fedpac-table2": Table(
        "FedPAC",
        "Table2-ablation",
        "final",
        "§5 Ablation: the average test accuracy on 20 clients, under Table 1's protocol",
    ),
    "fedpac-replication": Table(
        "FedPAC-replication", "Table1", "final", "Table 1 caption: the comparison of final test accuracy"
    ),
}
# Where a paper's row was produced by another form than the method's default, or is labelled
# otherwise: paper -> {method title: the label of the row it stands for}. Every other title is its
# own label; a default form displaced by another keeps a row of its own beside the published one.
RELABELLED = {
    # GPFL and FedCP ran their baselines in PFLlib (early 2023), whose FedPHP is its own form (algorithms/fedphp.py)
    # and whose pFedMe predicted with w_i as the authors' code does (algorithms/pfedme.py).
    "GPFL": {
        "FedPHP-PFLlib": "FedPHP",
        "FedPHP": "FedPHP (paper's form)",
        "pFedMe-official": "pFedMe",
        "pFedMe": "pFedMe (paper's form)",
    },
    "FedCP": {
        "FedPHP-PFLlib": "FedPHP",
        "FedPHP": "FedPHP (paper's form)",
        "pFedMe-official": "pFedMe",
        "pFedMe": "pFedMe (paper's form)",
    },
    # FedPAC's APFL: the authors' output mixing with a fixed α (algorithms/apfl.py); its kNN-Per: the original
    # scripts' logit mixing (algorithms/knnper.py).
    "FedPAC": {
        "APFL-outputs": "APFL",
        "APFL": "APFL (paper's form)",
        "kNN-Per-logits": "kNN-Per",
        "kNN-Per": "kNN-Per (paper's form)",
    },
    # The replication report labels its own run of FedPAC apart from the published row it reruns.
    "FedPAC-replication": {"FedPAC": "FedPAC-replicated"},
}

DATASET_LABELS = {
    "fmnist": "FMNIST",
    "mnist": "MNIST",
    "emnist": "EMNIST",
    "cifar10": "Cifar10",
    "cifar100": "Cifar100",
    "tinyimagenet": "TinyImageNet",
    "cinic10": "CINIC10",
    "agnews": "AGNews",
    "har": "HAR",
    "digits": "Digits",
}
DATASET_NAMES = {label: name for name, label in DATASET_LABELS.items()}
PATHOLOGICAL_CLASSES = {"MNIST": 2, "FMNIST": 2, "Cifar10": 2, "Cifar100": 10, "TinyImageNet": 20}  # GPFL/FedCP §4

# Experiment settings shared by search spaces (`setting: NAME` in a space file).
SETTINGS = {
    # GPFL Table 1 / FedCP Table 2, Fashion-MNIST practical: Dir(0.1), 20 clients, 4-layer CNN
    "pfllib-fmnist-dir0.1": {
        "dataset": "fmnist",
        "partition": "dir:0.1",
        "clients": 20,
        "backbone": "cnn4",
        "protocol": "pfllib",
        "rounds": 2000,
        "checkpoint_every": 50,
    },
    "fedpac-fmnist-pac20": {  # FedPAC Table 1, Fashion-MNIST: s = 20 % dominant classes, 20 clients, its CNN
        "dataset": "fmnist",
        "partition": "pac:20",
        "clients": 20,
        "protocol": "fedpac",
        "rounds": 200,
        "checkpoint_every": 20,
    },
}


def home_protocol(family: str) -> str:
    """The protocol a method runs under unless told: its own paper's; PFLlib's for every other method."""
    return next((p.protocol for p in PAPERS.values() if family in p.proposes), "pfllib")


def method_of(paper: str, label: str) -> str | None:
    """The method a row label of `paper` stands for (the form that produced it); None where none is implemented."""
    from algorithms import METHODS

    relabelled = (name for name, cls in METHODS.items() if label_in(paper, cls.title) == label)
    return next(relabelled, None) or next((name for name, cls in METHODS.items() if cls.title == label), None)


def label_in(paper: str, title: str) -> str:
    """How `paper`'s tables label the method titled `title`."""
    return RELABELLED.get(paper, {}).get(title, title)


def load_tables(path: Path = PUBLISHED) -> pd.DataFrame:
    """The published numbers, each row with its table's metric (`reported`: best or final round)."""
    metrics = pd.DataFrame([{"paper": t.paper, "table": t.name, "reported": t.reported} for t in TABLES.values()])
    paper = pd.read_csv(path).merge(metrics, on=["paper", "table"], how="left")
    paper["reported"] = paper["reported"].fillna("best")
    paper["join_ratio"] = paper["join_ratio"].map(join_ratio_label)
    paper["kind"] = (
        paper["setting"].str.split("_").str[0].where(~paper["setting"].str.startswith("dominant"), paper["setting"])
    )
    return paper


def join_ratio_label(text: object) -> str:
    return "-".join(f"{float(x):g}" for x in str(text).split("-"))


def is_main(paper: str, table: str) -> bool:
    return any(t.main for t in TABLES.values() if (t.paper, t.name) == (paper, table))


def cell_of(dataset: str, partition: str, backbone: str, clients: int, join_ratio: object) -> dict | None:
    """The paper-table coordinates of a run's data setting, or None for a setting no paper reports."""
    label = DATASET_LABELS.get(dataset)
    kind, value = parse_partition(partition)
    if kind == "pat":
        if PATHOLOGICAL_CLASSES.get(label or "") != value:
            return None
        setting, beta = "pathological", math.nan
    elif kind == "dir":
        setting, beta = "practical", float(value or 0)
    elif kind == "pac":
        setting, beta = f"dominant_s{value:g}", math.nan
    else:
        return None
    return {
        "dataset": label,
        "setting": setting,
        "beta": beta,
        "backbone": backbone,
        "num_clients": clients,
        "join_ratio": join_ratio_label(join_ratio),
    }


def partition_of(row: Any) -> str:
    """The partition argument of a published row's setting (the inverse of `cell_of`)."""
    if row.kind == "pathological":
        return f"pat:{PATHOLOGICAL_CLASSES[row.dataset]}"
    if row.kind == "practical":
        return f"dir:{row.beta:g}"
    return f"pac:{row.setting.removeprefix('dominant_s')}"
