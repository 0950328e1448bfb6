"""Every cell `tuner reproduce` lists for a paper table starts and trains under its paper's protocol,
on small files written in each dataset's own format.

What the data is small in: samples per class, FedPAC's per-client sizes (pac_train/pac_test) and
the Dirichlet floor (min_samples); everything else (backbone, batch, optimizer, clients,
participation, groups, augmentation) is the cell's protocol. Every cell of every table builds its
data, partition and method over its model, and the method's first client and server states. One
round of one local epoch (a protocol's epochs are the same loop, run longer) is trained for a
covering set of cells, in which every method family under each protocol, and every data setting
(dataset, partition, clients, join ratio, backbone, protocol), appears at least once: a cell can
only fail through its method, its data setting, or the build; a family's variants differ only in
loss terms that test_engine.py runs under both executors. Each trains a fifth of its clients (the
clients' steps are one vectorized program over whichever clients take part) and evaluates every
client on its own data. ResNet-18 cells are built here and trained in test_engine.py, where
every family trains it (BatchNorm under vmap) at a tenth of the cost of Tiny-ImageNet's 64x64 images.
Settings of more than 20 clients are built, and of them FedPAC's 100-client cell on Fashion-MNIST
trains (everyone takes part in its last round): the others' rounds are the same code over
more clients.
"""

import math
from dataclasses import replace

import pytest
import torch
from written_data import (
    accept_written_cifar,
    write_agnews,
    write_cifar,
    write_cinic10,
    write_mnist_like,
    write_tinyimagenet,
)

from algorithms import METHODS
from tuner.experiments import reproduce
from tuner.federated_run import build_data, build_method, build_simulation, check_batches
from tuner.settings import papers
from tuner.sweep.trials import trial_config

CPU = torch.device("cpu")
TRAIN_UP_TO = 20  # clients; larger settings are built, and one 100-client FedPAC cell is trained
COST = ["fmnist", "mnist", "emnist", "cifar10", "cinic10", "agnews", "cifar100", "tinyimagenet"]  # cheapest round first


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    accept_written_cifar(patch)
    root = tmp_path_factory.mktemp("tables")
    write_mnist_like(root / "fmnist", n_train=1000, n_test=200)
    write_mnist_like(root / "mnist" / "MNIST" / "raw", n_train=1000, n_test=200, compress=False)
    write_mnist_like(root / "emnist" / "EMNIST" / "raw", prefix="emnist-byclass", n_train=6200, n_test=1240, classes=62)
    write_cifar(root / "cifar10", 10, 200)
    write_cifar(root / "cifar100", 100, 1500)
    write_cifar(root / "cifar100-many", 100, 9000)  # FedCP Table 4's 500 clients need 14 samples each
    write_tinyimagenet(root / "tinyimagenet", 200, 2)
    write_cinic10(root / "cinic10", 25)
    write_agnews(root / "agnews", 1000)  # four classes at beta 0.1: most clients hold one class
    yield root
    patch.undo()


def cell_config(cell: dict, root, **changes):
    """The cell's run as a trial plans it, with FedPAC's clients one batch each, and `changes`."""
    folder = cell["dataset"] + ("-many" if cell["clients"] > 100 else "")  # FedCP Table 4
    cfg = trial_config({"rounds": 1, "data_dir": str(root / folder), "min_samples": 14}, {"cell": cell, "seed": 0})
    return replace(
        cfg.settings(), pac_train=cfg.batch_size, pac_test=20, **changes
    ).resolved()  # FedPAC's clients: one batch each


def data_key(cell: dict) -> tuple:
    return cell["dataset"], cell["partition"], cell["clients"], cell["join_ratio"], cell["backbone"], cell["protocol"]


def family(cell: dict) -> tuple:
    return METHODS[cell["method"]].family or cell["method"], cell["protocol"]


def all_cells() -> list[dict]:
    out = []
    for table in papers.TABLES:
        out += [c for c in reproduce.cells(table)[0] if c not in out]
    return out


def trainable(cell: dict) -> bool:
    return cell["clients"] <= TRAIN_UP_TO and cell["backbone"] != "resnet18"


def covering(todo: list[dict]) -> list[dict]:
    """Cells, cheapest first, each taken when it brings a method family or a data setting not yet in."""
    families, keys = {family(c) for c in todo}, {data_key(c) for c in todo if trainable(c)}
    chosen = []
    for cell in sorted(todo, key=lambda c: (COST.index(c["dataset"]), c["clients"])):
        if trainable(cell) and (family(cell) in families or data_key(cell) in keys):
            chosen.append(cell)
            families.discard(family(cell))
            keys.discard(data_key(cell))
    return chosen


@pytest.fixture
def every_cell(monkeypatch):
    monkeypatch.setattr(reproduce, "_available", lambda dataset, data_dir: True)


@pytest.mark.slow
@pytest.mark.parametrize("table", list(papers.TABLES))
def test_every_cell_of_the_table_builds(table, data_root, every_cell):
    built = {}
    for cell in reproduce.cells(table)[0]:  # FedPAC's 100-client cells and FedCP's 500 included
        cfg = cell_config(cell, data_root)
        key = (cfg.data_dir, cfg.partition, cfg.clients, cfg.groups)
        if key not in built:
            built[key] = build_data(cfg, CPU)
            check_batches(cfg, built[key])
        data = built[key]
        assert data.num_clients == cell["clients"]
        method = build_method(cfg, data)  # the stacking over clients is the same code for every method: trained below
        model = method.net.initial_state()
        client, server = method.init_client(model), method.init_server(model)
        assert client.keys() >= {k for k in server if method.is_shared(k)}, cell


@pytest.mark.slow
def test_a_covering_set_of_cells_trains_a_round(data_root, every_cell):
    todo = all_cells()
    trained = covering(todo)
    assert {family(c) for c in trained} == {family(c) for c in todo}
    assert {data_key(c) for c in trained} == {data_key(c) for c in todo if trainable(c)}
    hundred = {
        "method": "fedpac",
        "dataset": "fmnist",
        "partition": "pac:20",
        "clients": 100,
        "join_ratio": "0.3",
        "backbone": "pac_cnn",
        "protocol": "fedpac",
    }
    assert hundred in todo
    for cell in trained + [hundred]:
        # a fifth of the clients train; a protocol's epochs are the same loop, run longer
        cfg = cell_config({**cell, "join_ratio": "0.2"}, data_root, local_epochs=1)
        row = build_simulation(cfg).step()
        assert math.isfinite(row["train_loss"]) and 0 <= row["acc"] <= 1, cell
        # FedPAC's protocol has everyone in the last round, whatever the join ratio
        assert row["clients"] == (cell["clients"] if cfg.full_last_round else round(0.2 * cell["clients"])), cell
