"""One dataset's samples, and how they become model inputs.

Below both kinds of loader (the built-ins of datasets.py, a user's files of user_data.py): each returns a
`Dataset`. Images stay uint8 (N, C, H, W) to keep large datasets small in memory; `decode` turns a batch
into the normalized floats the backbones expect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Dataset:
    name: str
    x: torch.Tensor  # uint8 images (N, C, H, W), float signals, or int64 token ids
    y: torch.Tensor  # int64 labels in [0, num_classes)
    num_classes: int
    kind: str  # "image", "signal" or "text"
    pac_groups: list[list[int]] | None = None  # FedPAC's dominant class sets, where the paper fixes them
    vocab: int | None = None  # text: token ids are below this (the embedding's rows)
    owners: np.ndarray | None = None  # a user's data: the client of every sample (natural partition)
    is_train: np.ndarray | None = None  # a user's data: its own train/test split
    client_ids: list[str] | None = None  # a user's data: its own name of each client (owners index them)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


NORMALIZATIONS = ("half", "dataset", "none")  # none: inputs used as loaded (what is recorded where nothing applies)


def takes_normalization(ds: Dataset) -> bool:
    """Images stored as bytes are normalized; everything else (float images come normalized, as PFLlib's
    files, features, signals, token ids) is used as loaded."""
    return ds.kind == "image" and ds.x.dtype == torch.uint8


def decode(ds: Dataset, normalize: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Turn stored samples into model inputs. Images: `half` maps to [-1, 1] as PFLlib's
    Normalize(0.5, 0.5) does; `dataset` subtracts each channel's mean and divides by its std
    (over the pooled dataset), as FedPAC's CIFAR code does."""
    if normalize == "none" or not takes_normalization(ds):
        return lambda x: x
    if normalize == "half":
        return lambda x: x.float().mul_(2.0 / 255.0).sub_(1.0)
    mean, std = channel_stats(ds.x)
    shape = (-1, 1, 1)

    def standardize(x: torch.Tensor) -> torch.Tensor:
        m, s = mean.to(x.device).view(shape), std.to(x.device).view(shape)
        return x.float().div_(255.0).sub_(m).div_(s)

    return standardize


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of uint8 images in [0, 1], in chunks (a large dataset never goes to floats whole)."""
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for a in range(0, len(images), chunk):
        part = images[a : a + chunk].double().div_(255.0)
        total += part.sum((0, 2, 3))
        squares += (part**2).sum((0, 2, 3))
    n = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / n
    return mean.float(), (squares / n - mean**2).clamp(min=1e-12).sqrt().float()
