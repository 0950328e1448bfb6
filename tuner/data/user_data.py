"""A user's own federated data: `--dataset PATH`.

Three forms, each read into the pooled arrays every loader returns:

- **Parquet** (`.parquet`): a column `x`, one feature vector or image array (channels, height,
  width; or height, width for grey images) per row, as (nested) lists; an integer column `y`;
  optionally `client` (any values: each distinct one is a client, in sorted order) and `split`
  (`train` or `test`).
- **NumPy** (`.npz`): arrays `x` (samples first), `y`, and optionally `client` and `split` of the
  same meaning.
- **PFLlib's generated folders**: `train/0.npz, 1.npz, ...` and `test/0.npz, ...`, each holding
  PFLlib's pickled `data` dict of `x` and `y`, one file per client (what PFLlib's generators wrote
  for the user's earlier results): read as a natural partition with its own train/test split.

With a client column (or PFLlib's folders) `--partition natural` keeps the user's clients; any
other partition re-splits the pooled samples. Images stored as uint8 are normalized like the
built-in datasets; float inputs (PFLlib already normalized its images) are used as they are.
Every way the data can be wrong is one sentence naming the file and what to fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from tuner.data.dataset import Dataset
from tuner.errors import UserError

SUFFIXES = (".parquet", ".npz")
SPLITS = ("train", "test")


def is_user_data(name: str) -> bool:
    """A path rather than a built-in dataset's name."""
    return "/" in name or name.endswith(SUFFIXES) or name.startswith("~")


def load_user_data(path: str | Path):
    """The Dataset a file or folder holds (its `owners`/`is_train` set where the data says)."""
    p = Path(path).expanduser().resolve()
    stamp = (p, p.stat().st_mtime_ns) if p.exists() else None
    if stamp in _LOADED:
        return _LOADED[stamp]
    if p.is_dir():
        columns = _pfllib_folder(p)
    elif p.suffix == ".parquet" and p.is_file():
        columns = _parquet(p)
    elif p.suffix == ".npz" and p.is_file():
        columns = _npz(p)
    elif not p.exists():
        raise UserError(
            f"Dataset {p} does not exist; name a .parquet or .npz file, or a folder of PFLlib's train/ and test/ files."
        )
    else:
        raise UserError(
            f"Dataset {p} is neither a .parquet nor an .npz file nor a folder of PFLlib's train/ and test/ files."
        )
    ds = _dataset(p, *columns)
    _LOADED.clear()  # one dataset at a time: a sweep's trials all read the same one
    _LOADED[stamp] = ds
    return ds


_LOADED: dict = {}


# ---------------------------------------------------------------- the three forms


def _parquet(p: Path):
    try:
        table = pq.read_table(p)
    except (pa.ArrowInvalid, OSError) as e:
        raise UserError(
            f"Dataset {p} cannot be read as Parquet ({e}); write it with pandas' to_parquet or pyarrow."
        ) from None
    missing = [c for c in ("x", "y") if c not in table.column_names]
    if missing:
        raise UserError(
            f"Dataset {p} has no column {missing[0]}; it needs x (one feature vector or image per row) and y "
            "(integer labels)."
        )
    x = _nested_lists(table.column("x").combine_chunks(), p)
    get = lambda c: table.column(c).to_numpy(zero_copy_only=False) if c in table.column_names else None  # noqa: E731
    return x, get("y"), get("client"), get("split")


def _nested_lists(column: pa.Array, p: Path) -> np.ndarray:
    """(N, d1, d2, ...) from a column of (nested) lists of equal lengths."""
    shape = [len(column)]
    while (
        pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type)
    ):
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            row = int(np.flatnonzero(lengths != lengths[0])[0])
            raise UserError(
                f"Dataset {p}: the x of row {row} has {lengths[row]} values where row 0 has {lengths[0]}; "
                "every sample must have one shape."
            )
        shape.append(int(lengths[0]) if len(lengths) else 0)
        column = column.flatten()
    if column.null_count:
        raise UserError(f"Dataset {p}: x holds NaN or missing values; fill or drop those rows.")
    return column.to_numpy(zero_copy_only=False).reshape(shape)


def _npz(p: Path):
    try:
        with np.load(p, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except ValueError as e:
        raise UserError(
            f"Dataset {p} holds Python objects, not plain arrays ({e}); save x, y, client and split as numeric "
            "or string arrays."
        ) from None
    except OSError as e:
        raise UserError(f"Dataset {p} cannot be read as .npz ({e}).") from None
    missing = [c for c in ("x", "y") if c not in arrays]
    if missing:
        raise UserError(f"Dataset {p} has no array {missing[0]}; it needs x (samples first) and y (integer labels).")
    return arrays["x"], arrays["y"], arrays.get("client"), arrays.get("split")


def _pfllib_folder(p: Path):
    """PFLlib's generated folder: train/ and test/ of per-client files 0.npz ... N-1.npz, and config.json beside
    them (utils/dataset_utils.py save_file), whose client and class counts are checked against the files."""
    files = {s: {int(f.stem): f for f in (p / s).glob("*.npz") if f.stem.isdigit()} for s in SPLITS}
    if not files["train"] or not files["test"]:
        raise UserError(
            f"Folder {p} is not a PFLlib dataset: it needs train/ and test/ folders of per-client files 0.npz, "
            "1.npz, ..."
        )
    config = _pfllib_config(p)
    highest = max(*files["train"], *files["test"])
    clients = config.get("num_clients", highest + 1)
    if clients <= highest:
        raise UserError(
            f"Folder {p}: config.json says {clients} clients, but it holds {highest}.npz; fix config.json or "
            "regenerate the dataset."
        )
    for split in SPLITS:
        missing = [f"{i}.npz" for i in range(clients) if i not in files[split]]
        if missing:
            said = (
                f"config.json says {clients} clients"
                if config.get("num_clients") == clients
                else f"clients are numbered 0 ... {clients - 1}"
            )
            raise UserError(
                f"Folder {p}: {split}/ lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} ({said}); "
                "regenerate the dataset, or fix config.json."
            )
    xs, ys, owners, splits = [], [], [], []
    for split in SPLITS:
        for client in range(clients):
            x, y = _pfllib_client(files[split][client])
            xs.append(x)
            ys.append(y)
            owners.append(np.full(len(y), client))
            splits.append(np.full(len(y), split))
    shapes = {x.shape[1:] for x in xs}
    if len(shapes) > 1:
        raise UserError(
            f"Folder {p}: clients' samples have different shapes {sorted(shapes)}; every sample must have one shape."
        )
    y = np.concatenate(ys)
    classes = config.get("num_classes")
    if classes is not None and len(y) and classes != int(y.max()) + 1:
        raise UserError(
            f"Folder {p}: config.json says num_classes {classes}, but the clients' labels run 0 ... {int(y.max())} "
            f"({int(y.max()) + 1} classes); fix config.json or regenerate the dataset."
        )
    return np.concatenate(xs), y, np.concatenate(owners), np.concatenate(splits)


def _pfllib_config(p: Path) -> dict:
    """config.json's counts, where PFLlib wrote one ({} where it is absent)."""
    path = p / "config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
        return {k: int(config[k]) for k in ("num_clients", "num_classes") if k in config}
    except (ValueError, TypeError) as e:
        raise UserError(f"{path} is not PFLlib's config.json (JSON with num_clients and num_classes): {e}") from None


def _pfllib_client(f: Path) -> tuple[np.ndarray, np.ndarray]:
    """PFLlib's utils/dataset_utils.py save_file: np.savez_compressed(path, data={'x': ..., 'y': ...})."""
    try:
        with np.load(f, allow_pickle=True) as z:  # PFLlib pickles a dict; the user's own files
            data = z["data"].tolist()
        x = data["x"]
        first = x[0] if len(x) else None  # PFLlib's text datasets: (token ids, length) pairs
        if not (
            isinstance(first, (tuple, list)) and len(first) == 2 and np.ndim(first[0]) == 1 and np.isscalar(first[1])
        ):
            return np.asarray(x), np.asarray(data["y"])
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise UserError(
            f"{f} is not one of PFLlib's client files (a 'data' dict of x and y): {type(e).__name__}: {e}"
        ) from None
    raise UserError(
        f"{f} holds PFLlib's text format (each x a (tokens, length) pair), which is not read; "
        "write the token ids as one integer array per client, or use the built-in agnews."
    )


# ---------------------------------------------------------------- checks, and the Dataset


def _dataset(p: Path, x: np.ndarray, y, client, split):
    if y is None or len(y) != len(x):
        raise UserError(f"Dataset {p}: x has {len(x)} samples but y has {0 if y is None else len(y)} labels.")
    if len(x) == 0:
        raise UserError(f"Dataset {p} holds no samples.")
    y = _labels(np.asarray(y), p)
    if x.dtype == object or not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise UserError(f"Dataset {p}: x must hold numbers, not {x.dtype}.")
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        row = int(np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(1))[0])
        raise UserError(f"Dataset {p}: x holds NaN or infinite values (first in row {row}); fill or drop them.")
    if x.ndim == 3:  # (N, H, W): grey images
        x = x[:, None]
    if x.ndim not in (2, 4):
        raise UserError(
            f"Dataset {p}: each x must be a feature vector or an image (channels, height, width), not shape "
            f"{x.shape[1:]}."
        )
    image = x.ndim == 4
    tensor = torch.from_numpy(
        np.ascontiguousarray(x if image and x.dtype == np.uint8 else x.astype(np.float32))
    )  # bytes: images to normalize
    owners = is_train = ids = None
    if client is not None:
        codes, names = pd.factorize(np.asarray(client), sort=True)
        owners, ids = codes.astype(np.int64), [str(n) for n in names]
    if split is not None:
        split = np.asarray(split).astype(str)
        other = sorted(set(np.unique(split)) - set(SPLITS))
        if other:
            raise UserError(f"Dataset {p}: split holds '{other[0]}'; its values must be train or test.")
        is_train = split == "train"
        if owners is not None:
            empty = [c for c in range(owners.max() + 1) if not is_train[owners == c].any()]
            if empty:
                raise UserError(
                    f"Dataset {p}: client {ids[empty[0]]} has no training samples; give it some or drop it."
                )
    return Dataset(
        name=p.stem,
        x=tensor,
        y=torch.from_numpy(y),
        num_classes=int(y.max()) + 1,
        kind="image" if image else "signal",
        owners=owners,
        is_train=is_train,
        client_ids=ids,
    )


def _labels(y: np.ndarray, p: Path) -> np.ndarray:
    if y.dtype == bool or not np.issubdtype(y.dtype, np.number):
        raise UserError(f"Dataset {p}: y must hold integer class labels 0, 1, ..., not {y.dtype} values.")
    if np.issubdtype(y.dtype, np.floating) and not (np.isfinite(y).all() and (y == np.round(y)).all()):
        raise UserError(
            f"Dataset {p}: y must hold integer class labels, not fractions or NaN (first in row "
            f"{int(np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))[0])})."
        )
    y = y.astype(np.int64)
    if y.min() < 0:
        raise UserError(f"Dataset {p}: y holds the negative label {y.min()}; number classes 0, 1, ...")
    found = np.unique(y)
    if len(found) != found[-1] + 1:  # a class with no sample: labels 1..K would train an empty class 0
        missing = sorted(set(range(found[-1] + 1)) - set(found.tolist()))
        shown = ", ".join(map(str, found[:12])) + (", ..." if len(found) > 12 else "")
        raise UserError(
            f"Dataset {p}: y's labels are {shown}, with no sample of class {', '.join(map(str, missing[:5]))}; "
            f"number the classes 0, 1, ..., {len(found) - 1} (labels 1..K: subtract 1)."
        )
    return y
