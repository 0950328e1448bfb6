"""Splitting a pooled dataset over clients, as the papers do.

`iid`, `pat:n` (pathological: n classes per client, GPFL/FedCP), `dir:b` (practical: Dirichlet
b per class), `pac:s` (FedPAC: s % uniform over all classes, the rest from the client's
group's dominant classes, fixed sizes, test drawn from the same distribution, samples reused
across clients as FedPAC's code does), and `natural` (a user's data: its own clients, and its own
train/test split where it has one). Every client gets disjoint train / test (and optionally
validation) index sets into the pooled dataset.
Results are cached on disk under a hash of every setting that shapes them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tuner.errors import UserError
from tuner.files import write_atomic

CACHE_ROOT = Path(os.environ.get("TUNER_CACHE", Path.home() / ".cache" / "pfl-tuner")) / "partitions"


@dataclass(frozen=True)
class PartitionSpec:
    kind: str  # iid | pat | dir | pac | natural
    value: float | None  # classes per client, Dirichlet beta, or FedPAC's s in percent
    clients: int
    seed: int
    train_frac: float = 0.75
    val_frac: float = 0.0  # carved from each client's train part
    min_samples: int = 40  # Dirichlet draws are repeated until every client has this many
    balance: bool = False  # pathological: equal shares of each class among its holders
    groups: int = 5  # client i belongs to group i mod groups (pac, shifts)
    pac_train: int = 600
    pac_test: int = 600
    val_seed: int | None = None  # None: each client's last val_frac of its training part; a number: another draw

    def key(self, dataset: str, n_samples: int) -> str:
        fields = {k: v for k, v in asdict(self).items() if not (k == "val_seed" and v is None)}  # earlier keys kept
        blob = json.dumps({"dataset": dataset, "n": n_samples, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


class PartitionSetting(NamedTuple):
    """A partition setting as parsed: its kind and its number (None for a kind that takes none)."""

    kind: str
    value: float | None


def parse_partition(text: str) -> PartitionSetting:
    """'dir:0.1' -> ('dir', 0.1); 'iid' -> ('iid', None); checked against the kind's range (PARTITIONS)."""
    kind, _, value = text.partition(":")
    known = PARTITIONS.get(kind)
    if known is not None and known.value is None and not value:
        return PartitionSetting(kind, None)
    if known is not None and known.value is not None and value:
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not math.isnan(v) and known.valid(v):
            return PartitionSetting(kind, v)
        raise UserError(f"Partition '{text}': {kind}'s value must be {known.value}, not {value}.")
    raise UserError(f"Partition '{text}' is not understood; write {', '.join(k.help for k in PARTITIONS.values())}.")


@dataclass
class Partition:
    train: list[np.ndarray]
    test: list[np.ndarray]
    val: list[np.ndarray]
    group: np.ndarray  # group id of every client
    owners: list[int] | None = None  # natural: the data's own client index of each client (some may be left out)

    def sizes(self) -> np.ndarray:
        return np.array([len(t) for t in self.train])


def partition(
    labels: np.ndarray,
    num_classes: int,
    spec: PartitionSpec,
    pac_groups: list[list[int]] | None = None,
    dataset: str = "",
    owners: np.ndarray | None = None,
    is_train: np.ndarray | None = None,
) -> Partition:
    """Partition the pooled labels over spec.clients clients, cached under `dataset` (a user's data, whose
    file may change, is never cached). natural: `owners` gives each sample's client, `is_train` the split."""
    path = CACHE_ROOT / f"{dataset}-{spec.kind}-{spec.key(dataset, len(labels))}.npz"
    if dataset and path.exists():
        return _load(path, spec.clients)
    rng = np.random.default_rng(spec.seed)
    group = np.arange(spec.clients) % spec.groups
    if spec.kind == "pac":
        train, test = _pac(labels, num_classes, spec, group, pac_groups, rng)
    elif spec.kind == "natural" and is_train is not None:
        kept = natural_clients(owners, is_train, spec.train_frac, spec.min_samples)
        train = [rng.permutation(np.flatnonzero((owners == c) & is_train)) for c in kept]  # validation: a random part
        test = [np.flatnonzero((owners == c) & ~is_train) for c in kept]
    else:
        if spec.kind == "natural":
            kept = natural_clients(owners, None, spec.train_frac, spec.min_samples)
            owned = [np.flatnonzero(owners == c) for c in kept]
        else:  # a kind that pools the samples and deals them out
            owned = PARTITIONS[spec.kind].owned(labels, num_classes, spec, rng)
        if spec.kind != "natural":  # the user's clients are as they are; check_batches says if one cannot train
            _check_sizes(owned, spec)
        train, test = [], []
        for idx in owned:  # PFLlib splits each client's data after partitioning, not stratified
            idx = rng.permutation(idx)
            cut = int(round(spec.train_frac * len(idx)))
            train.append(idx[:cut])
            test.append(idx[cut:])
    val = []
    for i, idx in enumerate(train):
        n_val = int(round(spec.val_frac * len(idx)))
        if spec.val_seed is None:
            val.append(idx[len(idx) - n_val :])
            train[i] = idx[: len(idx) - n_val]
            continue
        # another validation draw from the same training part (the partition, test split and sizes unchanged), the
        # rest kept in its order
        drawn = np.sort(np.random.default_rng([spec.seed, spec.val_seed, i]).choice(len(idx), n_val, replace=False))
        val.append(idx[drawn])
        train[i] = np.delete(idx, drawn)
    result = Partition(train, test, val, group, kept if spec.kind == "natural" else None)
    if dataset:
        _save(path, result)
    return result


def natural_clients(owners: np.ndarray, is_train: np.ndarray | None, train_frac: float, min_samples: int) -> list[int]:
    """The data's own clients a natural partition keeps: those with `min_samples` training samples or more (their
    own training rows, or train_frac of their rows where the data has no split). Every one, unless min_samples is
    set: the user's clients are as they are."""
    n = int(owners.max()) + 1
    if is_train is not None:
        training = np.bincount(owners[is_train], minlength=n)
    else:
        training = np.round(train_frac * np.bincount(owners, minlength=n)).astype(int)  # as the split below cuts
    return [c for c in range(n) if training[c] >= min_samples]


def _check_sizes(owned: list[np.ndarray], spec: PartitionSpec) -> None:
    small = min(len(o) for o in owned)
    if small < spec.min_samples:
        raise UserError(
            f"Partition {spec.kind}:{spec.value:g} leaves a client with {small} samples (< "
            f"min_samples={spec.min_samples}); use fewer clients or a larger dataset."
            if spec.value is not None
            else f"Partition {spec.kind} leaves a client with {small} samples (< min_samples={spec.min_samples}); "
            "use fewer clients."
        )


def _pathological(
    labels: np.ndarray, num_classes: int, spec: PartitionSpec, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client holds exactly n classes; each class is split among its holders (disjoint)."""
    n = int(spec.value)
    present = np.unique(labels)
    if n > len(present):
        raise UserError(f"Partition pat:{n} asks for {n} classes per client but the dataset has {len(present)}.")
    holders: dict[int, list[int]] = {int(c): [] for c in present}
    for i in range(spec.clients):  # consecutive classes, wrapping round: client i holds i*n .. i*n+n-1
        for j in range(n):
            holders[int(present[(i * n + j) % len(present)])].append(i)
    owned: list[list[np.ndarray]] = [[] for _ in range(spec.clients)]
    for c, who in holders.items():
        if not who:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        shares = np.ones(len(who)) if spec.balance else rng.uniform(0.1, 1.0, len(who))  # unbalanced, as in GPFL/FedCP
        cuts = (np.cumsum(shares / shares.sum()) * len(idx)).astype(int)[:-1]
        for client, part in zip(who, np.split(idx, cuts), strict=True):
            owned[client].append(part)
    return [np.concatenate(p) if p else np.array([], dtype=np.int64) for p in owned]


def _dirichlet(
    labels: np.ndarray, num_classes: int, spec: PartitionSpec, rng: np.random.Generator, max_tries: int = 1000
) -> list[np.ndarray]:
    """Per class, q ~ Dir(beta) over clients; redraw until every client has min_samples."""
    n, k = len(labels), spec.clients
    if n < k * spec.min_samples:
        raise UserError(
            f"The dataset has {n} samples, too few for {k} clients of at least {spec.min_samples}; use fewer clients."
        )
    for _ in range(max_tries):
        owned: list[list[int]] = [[] for _ in range(k)]
        for c in range(num_classes):
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(k, spec.value))
            # As in the reference partitioner: a client already holding its fair share gets no more.
            q = q * np.array([len(o) < n / k for o in owned])
            q = q / q.sum() if q.sum() > 0 else np.full(k, 1.0 / k)
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            for o, part in zip(owned, np.split(idx, cuts), strict=True):
                o.extend(part.tolist())
        if min(len(o) for o in owned) >= spec.min_samples:
            return [np.array(o, dtype=np.int64) for o in owned]
    raise UserError(
        f"Partition dir:{spec.value:g} could not give each of {k} clients {spec.min_samples} samples in "
        f"{max_tries} draws; use a larger beta or fewer clients."
    )


def _iid(labels: np.ndarray, num_classes: int, spec: PartitionSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal shares of the shuffled samples."""
    return np.array_split(rng.permutation(len(labels)), spec.clients)


Owned = Callable[[np.ndarray, int, PartitionSpec, np.random.Generator], list[np.ndarray]]


def _no_pool(labels: np.ndarray, num_classes: int, spec: PartitionSpec, rng: np.random.Generator) -> list[np.ndarray]:
    raise AssertionError(f"partition {spec.kind} splits its own way, not by dealing out pooled samples")


@dataclass(frozen=True)
class PartitionKind:
    """A partition `--partition` takes, as KIND or KIND:VALUE: how the help and a refusal name it, what its value
    must be (None: it takes none) and whether a value is in range, and each client's samples dealt out of the
    pooled ones (`owned`; each client's then split into train and test). FedPAC's `pac` and the data's own
    clients (`natural`) split their own way (`partition`)."""

    help: str
    value: str | None = None
    valid: Callable[[float], bool] = lambda v: True
    owned: Owned = _no_pool


PARTITIONS: dict[str, PartitionKind] = {
    "iid": PartitionKind("iid", owned=_iid),
    "pat": PartitionKind(
        "pat:N (N classes per client)",
        "a whole number of classes per client, at least 1",
        lambda v: v >= 1 and v.is_integer(),
        _pathological,
    ),
    "dir": PartitionKind("dir:BETA (BETA > 0)", "a Dirichlet concentration above 0", lambda v: v > 0, _dirichlet),
    "pac": PartitionKind(
        "pac:S (S % uniform, 0-100)", "the uniform share in %, from 0 to 100", lambda v: 0 <= v <= 100
    ),
    "natural": PartitionKind("natural (your data's own clients)"),
}


def pac_dominant_classes(num_classes: int, groups: int, pac_groups: list[list[int]] | None) -> list[list[int]]:
    """FedPAC B.2: group g's dominant classes are three consecutive ones starting at 2g (10 classes)."""
    if pac_groups is not None:
        return pac_groups
    step = max(1, num_classes // groups)
    return [[(g * step + j) % num_classes for j in range(3)] for g in range(groups)]


def pac_counts(size: int, s: float, num_classes: int, dominant: list[int]) -> np.ndarray:
    """Exact per-class counts of one FedPAC client (its code): int(s·size) spread evenly over all classes,
    the last class taking the remainder; the rest evenly over the dominant classes, the last taking the remainder."""
    counts = np.zeros(num_classes, dtype=np.int64)
    uniform = int(size * s)
    counts += uniform // num_classes
    counts[-1] += uniform - num_classes * (uniform // num_classes)
    rest = size - uniform
    for j, c in enumerate(dominant):
        counts[c] += rest // len(dominant) + (
            rest - len(dominant) * (rest // len(dominant)) if j == len(dominant) - 1 else 0
        )
    return counts


class _Pool:
    """One class's samples of one split, handed out in order and started over when the next share does not fit."""

    def __init__(self, idx: np.ndarray, label: int, split: str):
        self.idx, self.label, self.split, self.pos = idx, label, split, 0

    def take(self, n: int) -> np.ndarray:
        if n > len(self.idx):
            raise UserError(
                f"Partition pac needs {n} {self.split} samples of class {self.label} for one client but the "
                f"dataset has {len(self.idx)}; "
                "use smaller pac_train/pac_test."
            )
        if self.pos + n > len(self.idx):
            self.pos = 0
        out = self.idx[self.pos : self.pos + n]
        self.pos += n
        return out


def _pac(labels, num_classes, spec, group, pac_groups, rng):
    """FedPAC B.2 as its code builds it: exact counts per class, samples reused across clients once a class's
    pool is used up (so 100 clients of 600 fit in Fashion-MNIST and CIFAR-10). Each class's pool is split once
    into a train and a test part, in proportion to the shares drawn, so no client's test sample is trained on."""
    dominant = pac_dominant_classes(num_classes, spec.groups, pac_groups)
    if pac_groups is not None and spec.groups != len(pac_groups):
        raise UserError(f"This dataset's pac partition has {len(pac_groups)} groups; set groups={len(pac_groups)}.")
    test_share = spec.pac_test / (spec.pac_train + spec.pac_test)
    pools = {}
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cut = int(round(len(idx) * (1 - test_share)))
        pools[c] = {"train": _Pool(idx[:cut], c, "training"), "test": _Pool(idx[cut:], c, "test")}
    s = spec.value / 100.0
    train, test = [], []
    for i in range(spec.clients):
        for size, split, out in ((spec.pac_train, "train", train), (spec.pac_test, "test", test)):
            counts = pac_counts(size, s, num_classes, dominant[group[i]])
            take = [pools[c][split].take(int(n)) for c, n in enumerate(counts) if n]
            out.append(rng.permutation(np.concatenate(take)))
    return train, test


def _save(path: Path, p: Partition) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"group": p.group}
    for name in ("train", "test", "val"):
        parts = getattr(p, name)
        arrays[name] = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
        arrays[name + "_sizes"] = np.array([len(x) for x in parts])

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would add .npz to a name
            np.savez(f, **arrays)

    write_atomic(path, write)  # a temporary file per process: trials that start together never share one


def _load(path: Path, clients: int) -> Partition:
    with np.load(path) as f:
        split = {n: np.split(f[n], np.cumsum(f[n + "_sizes"])[:-1]) for n in ("train", "test", "val")}
        return Partition(split["train"], split["test"], split["val"], f["group"])
