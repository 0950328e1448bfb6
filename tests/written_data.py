"""Small files in each dataset's exact on-disk format, written by the tests that need them."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image

rng = np.random.default_rng(0)


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def write_mnist_like(
    folder: Path, prefix: str = "", n_train: int = 12, n_test: int = 8, classes: int = 10, compress: bool = True
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        stem = f"{prefix}-{split}" if prefix else ("train" if split == "train" else "t10k")
        write_idx(folder / f"{stem}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), compress)
        write_idx(folder / f"{stem}-labels-idx1-ubyte", np.arange(n) % classes, compress)


def write_cifar(root: Path, classes: int, per_file: int) -> None:
    """The CIFAR release's pickles as torchvision reads them: five training batches and a test batch with
    batches.meta (CIFAR-10), or train and test with meta (CIFAR-100). Their md5 is not the release's: a test
    reading them lets torchvision's check pass (`accept_written_cifar`)."""
    if classes == 10:
        base, names, key = (
            root / "cifar-10-batches-py",
            [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"],
            "labels",
        )
        meta = ("batches.meta", "label_names")
    else:
        base, names, key = root / "cifar-100-python", ["train", "test"], "fine_labels"
        meta = ("meta", "fine_label_names")
    base.mkdir(parents=True, exist_ok=True)
    for name in names:
        with open(base / name, "wb") as f:
            pickle.dump(
                {
                    "data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
                    key: [i % classes for i in range(per_file)],
                },
                f,
            )
    (base / meta[0]).write_bytes(pickle.dumps({meta[1]: [str(i) for i in range(classes)]}))


def accept_written_cifar(monkeypatch) -> None:
    """torchvision's md5 check passes for the files write_cifar made (the release's sums are not theirs)."""
    import torchvision

    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args: True)


def write_image(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)


def write_tinyimagenet(root: Path, classes: int, per_class: int) -> None:
    """The release's layout: train/<wnid>/images/*.JPEG and val/images listed in val_annotations.txt."""
    base = root / "tiny-imagenet-200"
    lines = []
    for c in range(classes):
        wnid = f"n{c:08d}"
        for k in range(per_class):
            write_image(base / "train" / wnid / "images" / f"{wnid}_{k}.JPEG", 64)
        write_image(base / "val" / "images" / f"val_{c}.JPEG", 64)
        lines.append(f"val_{c}.JPEG\t{wnid}\t0\t0\t10\t10")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


def write_cinic10(root: Path, per_class: int) -> None:
    """train/, valid/ and test/ folders of 32x32 PNGs, one folder per class."""
    for split in ("train", "valid", "test"):
        for cls in ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"):
            for k in range(per_class):
                write_image(root / split / cls / f"{k}.png", 32)


def write_agnews(root: Path, per_class: int) -> None:
    """The CSV release: "class","title","description", classes numbered from 1."""
    words = [
        "market",
        "stocks",
        "peace",
        "talks",
        "chip",
        "team",
        "wins",
        "rates",
        "launch",
        "vote",
        "match",
        "science",
    ]
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", per_class), ("test", max(1, per_class // 4))):
        rows = [
            f'"{c + 1}","{" ".join(rng.choice(words, 3))}","{" ".join(rng.choice(words, 12))}"'
            for c in range(4)
            for _ in range(n)
        ]
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")


def write_har(root: Path, n_train: int, n_test: int) -> None:
    """UCI HAR's text files: nine inertial signals of 128 steps, labels 1..6."""
    for split, n in (("train", n_train), ("test", n_test)):
        folder = root / split / "Inertial Signals"
        folder.mkdir(parents=True)
        for s in ("body_acc", "body_gyro", "total_acc"):
            for a in "xyz":
                np.savetxt(folder / f"{s}_{a}_{split}.txt", rng.normal(size=(n, 128)))
        np.savetxt(root / split / f"y_{split}.txt", np.arange(n) % 6 + 1, fmt="%d")
