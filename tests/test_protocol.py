"""The papers' protocols: partitions that depend on data settings only, one table of defaults, FedPAC's
last-round participation, and its CIFAR augmentation and normalization."""

import numpy as np
import pytest
import torch

from tuner.data.augment import PAD, crop_flip
from tuner.data.dataset import decode
from tuner.data.datasets import load_dataset
from tuner.federated_run import build_data, build_simulation, partition_spec
from tuner.settings.config import RunConfig, apply_settings
from tuner.sweep.trials import trial_config

CPU = torch.device("cpu")


def config(method="fedavg", **settings):
    return apply_settings(
        RunConfig(method=method), {"dataset": "digits", "partition": "dir:0.1", "clients": 10, **settings}, "test"
    ).resolved()


def same_data(a, b) -> bool:
    return a.train.counts == b.train.counts and torch.equal(a.train.y, b.train.y) and torch.equal(a.test.x, b.test.x)


def test_the_partition_does_not_change_with_the_batch_size_or_the_run_seed():
    ds = load_dataset("digits")
    small, large = config(batch_size=10), config(batch_size=20)
    assert partition_spec(small, ds) == partition_spec(large, ds)
    assert partition_spec(small, ds).min_samples == 40  # PFLlib's generator floor: batch 10 / (1 - 0.75)
    assert same_data(build_data(small, CPU), build_data(large, CPU))
    assert same_data(build_data(config(seed=0), CPU), build_data(config(seed=3), CPU))
    assert not same_data(build_data(config(partition_seed=0), CPU), build_data(config(partition_seed=3), CPU))


def test_seed_reruns_vary_the_partition_only_when_asked():
    from tuner.sweep.runner import seed_grid

    assert seed_grid([1, 2], False) == {"seed": {"grid_search": [1, 2]}}
    pairs = seed_grid([1, 2], True)["seeding"]["grid_search"]
    cfg = trial_config({"method": "fedavg", "dataset": "digits"}, {"seeding": pairs[1], "lr": 0.1})
    assert (cfg.seed, cfg.partition_seed, cfg.lr) == (2, 2, 0.1)


@pytest.mark.parametrize(
    "method,settings,expected",
    [
        ("gpfl", {"dataset": "cifar10"}, {"backbone": "cnn4", "lr": 0.005, "lam": 0.01, "mu": 0.1, "batch_size": 10}),
        ("gpfl", {"dataset": "cifar10", "backbone": "resnet18"}, {"lr": 0.1, "lam": 1e-4, "mu": 0.0}),
        ("gpfl", {"dataset": "agnews"}, {"backbone": "fasttext", "lr": 0.1, "lam": 1e-4, "mu": 0.0}),
        ("gpfl", {"dataset": "har"}, {"backbone": "harcnn", "lr": 0.01, "lam": 0.01, "mu": 1.0}),
        ("gpfl-nomlg", {"dataset": "cifar10", "backbone": "resnet18"}, {"lam": 1e-4, "mlg": False}),
        ("fedcp", {"dataset": "cifar10"}, {"lam": 5.0}),
        ("fedcp", {"dataset": "tinyimagenet", "backbone": "resnet18"}, {"lam": 1.0, "lr": 0.1}),
        (
            "fedpac",
            {"dataset": "fmnist"},
            {
                "backbone": "pac_cnn",
                "lr": 0.01,
                "batch_size": 50,
                "local_epochs": 5,
                "momentum": 0.5,
                "weight_decay": 5e-4,
                "full_last_round": True,
                "augment": False,
            },
        ),
        (
            "fedpac",
            {"dataset": "cifar10"},
            {"backbone": "pac_cnn", "lr": 0.02, "augment": True, "normalize": "dataset"},
        ),
        ("fedpac", {"dataset": "emnist"}, {"batch_size": 100, "groups": 3}),
        ("fedpac-cc", {"dataset": "fmnist"}, {"lam": 0.0, "batch_size": 50}),
        (
            "fedavg",
            {"dataset": "fmnist", "protocol": "fedpac"},
            {"backbone": "pac_cnn", "batch_size": 50, "momentum": 0.5, "weight_decay": 5e-4},
        ),
        (
            "fedavg",
            {"dataset": "fmnist"},
            {"backbone": "cnn4", "batch_size": 10, "local_epochs": 1, "momentum": 0.0, "full_last_round": False},
        ),
        (
            "fedpac",
            {"dataset": "fmnist", "lr": 0.05, "backbone": "cnn4", "momentum": 0.0},
            {"lr": 0.05, "backbone": "cnn4", "momentum": 0.0},
        ),
        ("gpfl", {"dataset": "cifar10", "backbone": "resnet18", "lam": 0.5}, {"lam": 0.5, "mu": 0.0}),
    ],
)
def test_one_table_of_paper_defaults(method, settings, expected):
    cfg = apply_settings(RunConfig(method=method), settings, "test").resolved()
    got = {k: cfg.hparams[k] if k in cfg.hparams else getattr(cfg, k) for k in expected}
    assert got == expected


def test_the_search_space_default_point_and_reproduce_use_the_table(tmp_path):
    from tuner.experiments.reproduce import cells
    from tuner.sweep.space_file import load_space

    space = tmp_path / "s.yaml"
    space.write_text(
        "settings: {dataset: cifar10, backbone: resnet18}\nsearch:\n  lam: {loguniform: [1.0e-5, 1]}\n  mu: "
        "{uniform: [0, 1]}\n"
    )
    assert load_space(space, "gpfl").defaults() == {"lam": 1e-4, "mu": 0.0}
    todo, _ = cells("fedpac-table1", datasets=["fmnist"])
    assert todo and all(c["protocol"] == "fedpac" for c in todo)
    fedavg = trial_config({"rounds": 1}, {"cell": next(c for c in todo if c["method"] == "fedavg")})
    assert (fedavg.batch_size, fedavg.local_epochs, fedavg.momentum, fedavg.weight_decay, fedavg.lr) == (
        50,
        5,
        0.5,
        5e-4,
        0.01,
    )


def test_everyone_takes_part_in_the_last_round_when_the_protocol_says_so():
    for full in (True, False):
        sim = build_simulation(
            config(join_ratio="0.3", rounds=3, full_last_round=full, partition="iid", executor="sequential")
        )
        rows = [sim.step() for _ in range(3)]
        assert [r["clients"] for r in rows] == [3, 3, 10 if full else 3]


def test_crop_and_flip_move_pixels_as_torchvision_would():
    img = torch.arange(2 * 5 * 6, dtype=torch.uint8).view(1, 2, 5, 6)
    same = crop_flip(img, torch.tensor([[PAD, PAD, 0]]))
    assert torch.equal(same, img)
    assert torch.equal(crop_flip(img, torch.tensor([[PAD, PAD, 1]])), img.flip(-1))
    down_right = crop_flip(img, torch.tensor([[PAD + 1, PAD + 2, 0]]))  # shifted view, zeros past the edge
    assert torch.equal(down_right[0, :, :4, :4], img[0, :, 1:, 2:]) and down_right[0, :, 4:].abs().sum() == 0
    batch = torch.stack([img[0], img[0].flip(-1)])[None]  # (1, 2, C, H, W): any leading shape
    draws = torch.tensor([[[PAD, PAD, 1], [PAD, PAD, 1]]])
    assert torch.equal(crop_flip(batch, draws)[0, 1], img[0])


def test_augmented_training_is_the_same_under_both_executors_and_differs_from_plain():
    runs = {}
    for executor in ("sequential", "vectorized"):
        for augment in (True, False):
            sim = build_simulation(
                config("fedper", executor=executor, augment=augment, rounds=2, lr=0.05, dtype="float64")
            )
            sim.step()
            runs[executor, augment] = sim
    for k, v in runs["sequential", True].clients.items():
        # float64: rounding is ~1e-15
        torch.testing.assert_close(runs["vectorized", True].clients[k], v, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(
        runs["sequential", True].clients["head.weight"], runs["sequential", False].clients["head.weight"]
    )


def test_dataset_normalization_standardizes_each_channel():
    ds = load_dataset("digits")
    x = decode(ds, "dataset")(ds.x)
    assert abs(x.mean().item()) < 1e-4 and x.std().item() == pytest.approx(1.0, abs=1e-3)
    half = decode(ds, "half")(ds.x)
    assert half.min().item() == -1.0 and half.max().item() == pytest.approx(1.0)
    assert np.isclose(x.numpy().std(), 1.0, atol=1e-3)


@pytest.mark.slow
def test_every_cell_of_every_table_resolves_under_its_protocol_and_fmnist_cells_build(monkeypatch):
    from tuner.data.datasets import DEBIAN_FMNIST
    from tuner.experiments import reproduce
    from tuner.settings import papers

    monkeypatch.setattr(reproduce, "_available", lambda dataset, data_dir: True)  # every cell, whatever data is here
    built = {}
    for table, paper in ((slug, t.paper) for slug, t in papers.TABLES.items()):
        todo, _ = reproduce.cells(table)
        assert todo, table
        for cell in todo:
            cfg = trial_config({"rounds": 1}, {"cell": cell, "seed": 0})
            assert cfg.protocol == ("fedpac" if paper.startswith("FedPAC") else "pfllib")
            if paper.startswith("FedPAC"):
                assert (cfg.batch_size, cfg.local_epochs, cfg.momentum, cfg.full_last_round) == (
                    (100 if cfg.dataset == "emnist" else 50),
                    5,
                    0.5,
                    True,
                )
                assert cfg.groups == (3 if cfg.dataset == "emnist" else 5) and cfg.augment == (
                    cfg.dataset in ("cifar10", "cinic10")
                )
            else:
                assert (cfg.batch_size, cfg.local_epochs, cfg.momentum) == (10, 1, 0.0)
            if cfg.dataset == "fmnist" and DEBIAN_FMNIST.exists():
                key = (cfg.partition, cfg.clients, cfg.groups)
                if key not in built:  # FedPAC's 100-client cells included: the pac partition reuses samples
                    built[key] = build_data(cfg, CPU)
                sim = build_simulation(cfg, built[key])
                assert sim.data.num_clients == cfg.clients
    if DEBIAN_FMNIST.exists():
        assert ("pac:20", 100, 5) in built and ("dir:0.1", 20, 5) in built
