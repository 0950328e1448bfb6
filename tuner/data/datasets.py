"""Dataset loaders: each returns the pooled (train + test) samples of one dataset.

The papers pool a dataset's official splits and re-split per client, so a loader returns one
array of samples and one of labels (a `Dataset`, tuner/data/dataset.py). Loaders read the standard on-disk
layouts; where a user has internet, the torchvision download fills those layouts first.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tuner.data.dataset import Dataset
from tuner.data.user_data import is_user_data, load_user_data
from tuner.errors import UserError

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_ROOT = Path.home() / ".cache" / "pfl-tuner" / "data"


AS_LOADED = ("agnews", "har")  # built-ins whose inputs are not bytes of images: token ids, float signals


# ---------------------------------------------------------------- IDX (MNIST family)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped): the MNIST family's format."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise UserError(f"{path} is not an unsigned-byte IDX file.")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise UserError(f"{path} is truncated: expected {int(np.prod(shape))} values, found {arr.size}.")
    return arr.reshape(shape)


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    return None


def _idx_pair(folder: Path, prefix: str, split: str) -> tuple[np.ndarray, np.ndarray] | None:
    split_stem = "train" if split == "train" else "t10k"
    if prefix:  # EMNIST: emnist-byclass-train-images-idx3-ubyte
        images, labels = f"{prefix}-{split}-images-idx3-ubyte", f"{prefix}-{split}-labels-idx1-ubyte"
    else:
        images, labels = f"{split_stem}-images-idx3-ubyte", f"{split_stem}-labels-idx1-ubyte"
    pi, pl = _find(folder, images), _find(folder, labels)
    if pi is None or pl is None:
        return None
    return read_idx(pi), read_idx(pl)


def _load_idx_dataset(name: str, folders: list[Path], prefix: str, hint: str) -> tuple[np.ndarray, np.ndarray]:
    for folder in folders:
        train, test = _idx_pair(folder, prefix, "train"), _idx_pair(folder, prefix, "test")
        if train and test:
            return np.concatenate([train[0], test[0]]), np.concatenate([train[1], test[1]])
    looked = ", ".join(str(f) for f in folders)
    raise UserError(f"No {name} IDX files found (looked in {looked}); {hint}")


def _download(fn: Callable[[], object], name: str) -> None:
    """Let torchvision fill its standard layout; offline this fails and the caller explains."""
    try:
        fn()
    except Exception:  # no network, or a mirror down: the loader's own message says what to do
        pass


def load_fmnist(data_dir: Path | None, download: bool) -> Dataset:
    root = data_dir or DEFAULT_ROOT
    folders = [root, root / "FashionMNIST" / "raw"] + ([] if data_dir else [DEBIAN_FMNIST])
    if download and not any(_idx_pair(f, "", "train") for f in folders):
        import torchvision

        _download(lambda: torchvision.datasets.FashionMNIST(str(root), train=True, download=True), "fmnist")
        _download(lambda: torchvision.datasets.FashionMNIST(str(root), train=False, download=True), "fmnist")
    x, y = _load_idx_dataset(
        "Fashion-MNIST",
        folders,
        "",
        "install Debian's package dataset-fashion-mnist, or pass --set data_dir=FOLDER with the four IDX files.",
    )
    return Dataset("fmnist", torch.from_numpy(x.copy()).unsqueeze(1), torch.from_numpy(y.astype(np.int64)), 10, "image")


def load_mnist(data_dir: Path | None, download: bool) -> Dataset:
    root = data_dir or DEFAULT_ROOT
    folders = [root / "MNIST" / "raw", root]
    if download and not any(_idx_pair(f, "", "train") for f in folders):
        import torchvision

        _download(lambda: torchvision.datasets.MNIST(str(root), train=True, download=True), "mnist")
        _download(lambda: torchvision.datasets.MNIST(str(root), train=False, download=True), "mnist")
    x, y = _load_idx_dataset(
        "MNIST", folders, "", "pass --set data_dir=FOLDER holding MNIST/raw/ (torchvision layout)."
    )
    return Dataset("mnist", torch.from_numpy(x.copy()).unsqueeze(1), torch.from_numpy(y.astype(np.int64)), 10, "image")


def load_emnist(data_dir: Path | None, download: bool) -> Dataset:
    root = data_dir or DEFAULT_ROOT
    folders = [root / "EMNIST" / "raw", root]
    if download and not any(_idx_pair(f, "emnist-byclass", "train") for f in folders):
        import torchvision

        _download(lambda: torchvision.datasets.EMNIST(str(root), "byclass", train=True, download=True), "emnist")
    x, y = _load_idx_dataset(
        "EMNIST (byclass)",
        folders,
        "emnist-byclass",
        "pass --set data_dir=FOLDER holding EMNIST/raw/ (torchvision layout).",
    )
    x = np.ascontiguousarray(x.transpose(0, 2, 1))  # EMNIST stores images transposed
    # FedPAC's EMNIST groups: digits, upper-case and lower-case letters (byclass label order).
    groups = [list(range(0, 10)), list(range(10, 36)), list(range(36, 62))]
    return Dataset(
        "emnist", torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y.astype(np.int64)), 62, "image", groups
    )


# ---------------------------------------------------------------- CIFAR (python pickles)


def _load_cifar(name: str, data_dir: Path | None, download: bool, kind: str, classes: int) -> Dataset:
    """Read through torchvision's own class, which checks every file's md5: a damaged or partial file is one
    sentence, never an unpickling error."""
    import torchvision

    root = data_dir or DEFAULT_ROOT
    cls = getattr(torchvision.datasets, kind)
    if download and not (root / cls.base_folder).exists():
        _download(lambda: cls(str(root), train=True, download=True), name)
    try:
        parts = [cls(str(root), train=train) for train in (True, False)]
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
        raise UserError(
            f"No whole {name} at {root / cls.base_folder} ({str(e).split('.')[0].lower()}); pass --set data_dir=FOLDER "
            f"holding {cls.base_folder}/ as torchvision unpacks it, or download it again."
        ) from None
    x = np.concatenate([p.data for p in parts]).transpose(0, 3, 1, 2)  # torchvision keeps (N, H, W, C)
    y = np.concatenate([np.asarray(p.targets, dtype=np.int64) for p in parts])
    return Dataset(name, torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y), classes, "image")


def load_cifar10(data_dir: Path | None, download: bool) -> Dataset:
    return _load_cifar("cifar10", data_dir, download, "CIFAR10", 10)


def load_cifar100(data_dir: Path | None, download: bool) -> Dataset:
    return _load_cifar("cifar100", data_dir, download, "CIFAR100", 100)


# ---------------------------------------------------------------- image folders


def _read_images(paths: list[Path], size: int) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    for i, p in enumerate(paths):
        with Image.open(p) as im:
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size))
            out[i] = np.asarray(im).transpose(2, 0, 1)
    return out


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}


def _class_folder(folder: Path, classes: list[str]) -> tuple[list[Path], list[int]]:
    paths, labels = [], []
    for label, cls in enumerate(classes):
        for p in sorted((folder / cls).rglob("*")):
            if p.suffix.lower() in IMAGE_SUFFIXES:
                paths.append(p)
                labels.append(label)
    return paths, labels


def load_tinyimagenet(data_dir: Path | None, download: bool) -> Dataset:
    base = (data_dir or DEFAULT_ROOT) / "tiny-imagenet-200"
    if not (base / "train").is_dir():
        raise UserError(
            f"No Tiny-ImageNet at {base}; unpack tiny-imagenet-200.zip into the folder --set data_dir=FOLDER names."
        )
    classes = sorted(p.name for p in (base / "train").iterdir() if p.is_dir())
    paths, labels = _class_folder(base / "train", classes)
    index = {c: i for i, c in enumerate(classes)}
    annotations = base / "val" / "val_annotations.txt"
    if annotations.exists():  # the release's layout: val/images/*.JPEG listed with their class
        for line in annotations.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 2 and parts[1] in index:
                paths.append(base / "val" / "images" / parts[0])
                labels.append(index[parts[1]])
    x = _read_images(paths, 64)
    return Dataset("tinyimagenet", torch.from_numpy(x), torch.tensor(labels, dtype=torch.int64), len(classes), "image")


def load_cinic10(data_dir: Path | None, download: bool) -> Dataset:
    base = data_dir or DEFAULT_ROOT / "cinic-10"
    if not (base / "train").is_dir():
        raise UserError(
            f"No CINIC-10 at {base}; pass --set data_dir=FOLDER holding train/, valid/ and test/ class folders."
        )
    classes = sorted(p.name for p in (base / "train").iterdir() if p.is_dir())
    paths, labels = [], []
    for split in ("train", "valid", "test"):
        if (base / split).is_dir():
            split_paths, split_labels = _class_folder(base / split, classes)
            paths += split_paths
            labels += split_labels
    x = _read_images(paths, 32)
    return Dataset("cinic10", torch.from_numpy(x), torch.tensor(labels, dtype=torch.int64), len(classes), "image")


# ---------------------------------------------------------------- AG News (CSV release)

AGNEWS_VOCAB = 32000
AGNEWS_MAX_LEN = 200


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def load_agnews(data_dir: Path | None, download: bool) -> Dataset:
    base = data_dir or DEFAULT_ROOT / "ag_news_csv"
    files = [base / "train.csv", base / "test.csv"]
    if not all(f.exists() for f in files):
        raise UserError(f"No AG News CSV files at {base}; pass --set data_dir=FOLDER holding train.csv and test.csv.")
    texts, labels = [], []
    for f in files:
        with open(f, newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                if len(row) < 2:
                    continue
                labels.append(int(row[0]) - 1)  # the release numbers classes from 1
                texts.append(tokenize(" ".join(row[1:])))
    counts = Counter(tok for t in texts for tok in t)
    vocab = {tok: i + 2 for i, (tok, _) in enumerate(counts.most_common(AGNEWS_VOCAB - 2))}  # 0 pad, 1 unknown
    ids = np.zeros((len(texts), AGNEWS_MAX_LEN), dtype=np.int64)
    for i, t in enumerate(texts):
        row = [vocab.get(tok, 1) for tok in t[:AGNEWS_MAX_LEN]]
        ids[i, : len(row)] = row
    return Dataset(
        "agnews", torch.from_numpy(ids), torch.tensor(labels, dtype=torch.int64), 4, "text", vocab=len(vocab) + 2
    )


# ---------------------------------------------------------------- UCI HAR (text files)

HAR_SIGNALS = [f"{s}_{a}" for s in ("body_acc", "body_gyro", "total_acc") for a in "xyz"]


def load_har(data_dir: Path | None, download: bool) -> Dataset:
    base = data_dir or DEFAULT_ROOT / "UCI HAR Dataset"
    xs, ys = [], []
    for split in ("train", "test"):
        folder = base / split / "Inertial Signals"
        label_file = base / split / f"y_{split}.txt"
        if not label_file.exists():
            raise UserError(
                f"No UCI HAR data at {base} (missing {label_file.name}); pass --set data_dir=FOLDER holding "
                "'UCI HAR Dataset'."
            )
        signals = [np.loadtxt(folder / f"{s}_{split}.txt", dtype=np.float32, ndmin=2) for s in HAR_SIGNALS]
        xs.append(np.stack(signals, axis=1)[:, :, None, :])  # (N, 9 channels, 1, 128 steps)
        ys.append(np.loadtxt(label_file, dtype=np.int64, ndmin=1) - 1)
    return Dataset("har", torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)), 6, "signal")


# ---------------------------------------------------------------- scikit-learn digits


def load_digits(data_dir: Path | None, download: bool) -> Dataset:
    """scikit-learn's bundled copy (1797 rows of 64 pixels at 0..16, then the label), read from its file: importing
    scikit-learn costs each process (each Ray trial) two seconds of SciPy for a 1797-row CSV."""
    package = importlib.util.find_spec("sklearn")
    if package is None:
        raise UserError("The digits dataset is scikit-learn's: install scikit-learn.")
    rows = np.loadtxt(
        Path(package.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz",
        delimiter=",",
        dtype=np.int64,
    )
    x = np.round(rows[:, :64].reshape(-1, 1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16 grey levels as bytes
    return Dataset("digits", torch.from_numpy(x), torch.from_numpy(rows[:, 64]), 10, "image")


LOADERS: dict[str, Callable[[Path | None, bool], Dataset]] = {
    "fmnist": load_fmnist,
    "digits": load_digits,
    "mnist": load_mnist,
    "emnist": load_emnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "tinyimagenet": load_tinyimagenet,
    "cinic10": load_cinic10,
    "agnews": load_agnews,
    "har": load_har,
}


def load_dataset(name: str, data_dir: str | Path | None = None, download: bool = True) -> Dataset:
    """A built-in dataset by name, or a user's own file or folder by path (tuner/data/user_data.py)."""
    if is_user_data(name):
        return load_user_data(name)
    if name not in LOADERS:
        raise UserError(
            f"Unknown dataset '{name}'; choose one of {', '.join(LOADERS)}, or give a path to your own "
            "(.parquet, .npz, PFLlib folder)."
        )
    return LOADERS[name](Path(data_dir).expanduser() if data_dir else None, download)
