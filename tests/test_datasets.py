"""Each loader reads small files that the test writes in that dataset's exact on-disk format."""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from written_data import rng, write_idx, write_image, write_mnist_like

from tuner.data.datasets import DEBIAN_FMNIST, load_dataset, read_idx
from tuner.errors import UserError
from tuner.models import build_backbone

ROOT = Path(__file__).resolve().parents[1]


def test_idx_reader_checks_format(tmp_path):
    write_idx(tmp_path / "a", np.arange(6).reshape(2, 3), compress=False)
    assert read_idx(tmp_path / "a").tolist() == [[0, 1, 2], [3, 4, 5]]
    (tmp_path / "b").write_bytes(b"\x00\x00\x0d\x01junk")
    with pytest.raises(UserError, match="not an unsigned-byte IDX"):
        read_idx(tmp_path / "b")


def test_fmnist_from_data_dir(tmp_path):
    write_mnist_like(tmp_path)
    ds = load_dataset("fmnist", tmp_path, download=False)
    assert ds.x.shape == (20, 1, 28, 28) and ds.x.dtype == torch.uint8
    assert ds.y.tolist() == [i % 10 for i in range(12)] + [i % 10 for i in range(8)]


@pytest.mark.skipif(not DEBIAN_FMNIST.exists(), reason="Debian's dataset-fashion-mnist is not installed")
def test_real_fmnist_from_debian():
    ds = load_dataset("fmnist", download=False)
    assert ds.x.shape == (70000, 1, 28, 28)
    assert torch.bincount(ds.y).tolist() == [7000] * 10


def test_mnist_and_emnist_torchvision_layout(tmp_path):
    write_mnist_like(tmp_path / "MNIST" / "raw", compress=False)
    assert load_dataset("mnist", tmp_path, download=False).x.shape == (20, 1, 28, 28)
    write_mnist_like(tmp_path / "EMNIST" / "raw", prefix="emnist-byclass", classes=62)
    ds = load_dataset("emnist", tmp_path, download=False)
    assert ds.num_classes == 62 and len(ds.pac_groups) == 3
    raw = read_idx(next((tmp_path / "EMNIST" / "raw").glob("emnist-byclass-train-images*")))
    assert torch.equal(ds.x[0, 0], torch.from_numpy(raw[0].T.copy()))  # EMNIST is stored transposed


def test_cifar_pickles(tmp_path, monkeypatch):
    import torchvision

    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(base / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 9]}, f)
    with pytest.raises(
        UserError, match="No whole cifar10 at .*cifar-10-batches-py \\(dataset not found or corrupted\\)"
    ):
        # files that are not the release's (md5): refused, in one sentence
        load_dataset("cifar10", tmp_path, download=False)
    (base / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))
    # these small files stand for the release
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args: True)
    ds = load_dataset("cifar10", tmp_path, download=False)
    assert ds.x.shape == (24, 3, 32, 32) and ds.y[:4].tolist() == [0, 1, 2, 9]
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    (base / "meta").write_bytes(pickle.dumps({"fine_label_names": [str(i) for i in range(100)]}))
    for name in ("train", "test"):
        with open(base / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), "fine_labels": [5, 50, 99]}, f)
    ds = load_dataset("cifar100", tmp_path, download=False)
    assert ds.num_classes == 100 and ds.y.tolist() == [5, 50, 99] * 2


def test_tinyimagenet_release_layout(tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    for wnid in ("n01", "n02"):
        for k in range(2):
            write_image(base / "train" / wnid / "images" / f"{wnid}_{k}.JPEG", 64)
    write_image(base / "val" / "images" / "val_0.JPEG", 64)
    (base / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn02\t0\t0\t10\t10\n")
    ds = load_dataset("tinyimagenet", tmp_path, download=False)
    assert ds.x.shape == (5, 3, 64, 64) and ds.y.tolist() == [0, 0, 1, 1, 1]


def test_cinic10_class_folders(tmp_path):
    for split in ("train", "valid", "test"):
        for cls in ("airplane", "cat"):
            write_image(tmp_path / split / cls / "a.png", 32)
    ds = load_dataset("cinic10", tmp_path, download=False)
    assert ds.x.shape == (6, 3, 32, 32) and sorted(ds.y.tolist()) == [0, 0, 0, 1, 1, 1]


def test_agnews_csv_release(tmp_path):
    (tmp_path / "train.csv").write_text(
        '"3","Wall St. Bears","Short-sellers are back"\n"1","World news","Peace talks, again"\n'
    )
    (tmp_path / "test.csv").write_text('"4","Sci/Tech","New chip is fast"\n')
    ds = load_dataset("agnews", tmp_path, download=False)
    assert ds.y.tolist() == [2, 0, 3] and ds.x.shape == (3, 200) and ds.num_classes == 4
    assert (ds.x[0] > 0).sum() == 7 and (ds.x[0, 7:] == 0).all()  # seven tokens, then padding
    assert ds.vocab == int(ds.x.max()) + 1 == 20  # 18 distinct words, padding and unknown: fastText's embedding rows
    assert build_backbone("fasttext", ds.input_shape, 4, ds.vocab).body[0].embedding.num_embeddings == 20


def test_har_text_files(tmp_path):
    base = tmp_path
    for split, n in (("train", 3), ("test", 2)):
        folder = base / split / "Inertial Signals"
        folder.mkdir(parents=True)
        for s in ("body_acc", "body_gyro", "total_acc"):
            for a in "xyz":
                np.savetxt(folder / f"{s}_{a}_{split}.txt", rng.normal(size=(n, 128)))
        np.savetxt(base / split / f"y_{split}.txt", np.arange(1, n + 1), fmt="%d")
    ds = load_dataset("har", base, download=False)
    assert ds.x.shape == (5, 9, 1, 128) and ds.y.tolist() == [0, 1, 2, 0, 1]


def test_digits_are_bundled_and_read_as_scikit_learn_loads_them():
    from sklearn.datasets import load_digits

    ds, theirs = load_dataset("digits"), load_digits()
    assert ds.x.shape == (1797, 1, 8, 8) and ds.num_classes == 10
    assert torch.equal(ds.x, torch.from_numpy(np.round(theirs.images * (255.0 / 16.0)).astype(np.uint8)[:, None]))
    assert torch.equal(ds.y, torch.from_numpy(theirs.target).long())


def test_loading_digits_does_not_import_scikit_learn():
    """Each Ray trial is a fresh process: scikit-learn (with SciPy's statistics) costs it a second or two."""
    code = (
        "import sys; import tuner.federated_run; from tuner.data.datasets import load_dataset; load_dataset('digits'); "
        "print(sorted(m for m in ('sklearn', 'scipy.stats') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_missing_data_names_the_path(tmp_path):
    for name in ("fmnist", "mnist", "emnist", "cifar10", "cifar100", "tinyimagenet", "cinic10", "agnews", "har"):
        with pytest.raises(UserError, match=str(tmp_path)):
            load_dataset(name, tmp_path, download=False)
    with pytest.raises(UserError, match="Unknown dataset"):
        load_dataset("imagenet")


def test_a_dataset_registered_in_loaders_alone_runs_and_the_help_lists_the_registry(tmp_path, monkeypatch):
    """The map's promise (docs/architecture.md): a built-in dataset touches tuner/data/datasets.py alone. A toy
    loader added to LOADERS there, and nowhere else, is a dataset `tuner run` takes, under the papers' defaults."""
    from cli_runs import invoke

    from tuner.cli.common import DATA_EPILOG
    from tuner.data import datasets
    from tuner.data.dataset import Dataset

    def load_toy(data_dir, download):
        g = torch.Generator().manual_seed(0)
        x = (torch.rand(480, 1, 28, 28, generator=g) * 255).to(torch.uint8)
        return Dataset("toy", x, torch.randint(0, 4, (480,), generator=g), 4, "image")

    monkeypatch.setitem(datasets.LOADERS, "toy", load_toy)
    toy = ["--dataset", "toy", "--partition", "iid", "--clients", "4", "--rounds", "1"]
    res = invoke("run", "fedavg", *toy, "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output
    assert pd.read_parquet(tmp_path / "run" / "metrics.parquet")["round"].tolist() == [1]
    assert all(name in DATA_EPILOG for name in datasets.LOADERS if name != "toy")  # the help names every one
