"""Client data resident on the device: every client's split concatenated into one tensor.

Batches are index gathers into these tensors, so a round never touches the disk or a
DataLoader. Group shifts (FedPAC's concept shift and feature skew) are applied here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import torch

from tuner.data.dataset import Dataset, decode
from tuner.data.partition import Partition
from tuner.errors import UserError

SHIFTS = ("none", "concept", "rotate")


@dataclass
class Split:
    """One split (train, test or val) of all clients: client i owns rows offsets[i]:offsets[i+1]."""

    x: torch.Tensor
    y: torch.Tensor
    counts: list[int]

    @cached_property
    def offsets(self) -> list[int]:
        return [0, *np.cumsum(self.counts).tolist()]

    @cached_property
    def starts(self) -> list[int]:
        """Where each client's rows begin (a tiled split's copies begin where their client does)."""
        return self.offsets[:-1]

    def tiled(self, copies: int) -> Split:
        """The split with its clients `copies` times over, client i of copy c being client c·N + i, every copy
        reading the same rows (a pack's federations: tuner/engine/pack.py); only `starts` and `counts` locate a
        tiled client."""
        out = Split(self.x, self.y, self.counts * copies)
        out.__dict__["starts"] = self.starts * copies
        return out

    def client(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.x[a:b], self.y[a:b]

    @cached_property
    def _device_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(offsets, counts) on the data's device, so index building never copies from the host."""
        return (torch.tensor(self.starts, device=self.y.device), torch.tensor(self.counts, device=self.y.device))

    def padded_index(self, ids: torch.Tensor, start: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows start:start+width of each client in ids (a tensor on the data's device), as (index, mask) on
        that device; short clients are padded."""
        offsets, counts = self._device_table
        pos = torch.arange(start, start + width, device=self.y.device)
        mask = pos[None, :] < counts[ids][:, None]
        index = offsets[ids][:, None] + torch.where(mask, pos[None, :], 0)
        return index.clamp_(max=max(len(self.y) - 1, 0)), mask


@dataclass
class FederatedData:
    train: Split
    test: Split
    val: Split | None
    num_classes: int
    input_shape: tuple[int, ...]
    group: np.ndarray
    decode: Callable[[torch.Tensor], torch.Tensor]
    vocab: int | None = None  # text: how many token ids there are
    holdout: Split | None = None  # part of each client's training data kept out of local training (hold_out)
    client_names: list[str] | None = None  # the data's own id of each client (natural partitions); else its index

    def client_name(self, i: int) -> str:
        return self.client_names[i] if self.client_names else str(i)

    @property
    def num_clients(self) -> int:
        return len(self.train.counts)

    def hold_out(self, frac: float) -> FederatedData:
        """The last `frac` of each client's training rows set apart (as PFLlib's FedFomo does): local
        training sees the rest, a method's statistics see these."""
        keep, held = [], []
        for i, n in enumerate(self.train.counts):
            start, cut = self.train.offsets[i], n - int(frac * n)
            keep.append(torch.arange(start, start + cut))
            held.append(torch.arange(start + cut, start + n))

        def take(rows: list[torch.Tensor]) -> Split:
            idx = torch.cat(rows).to(self.train.y.device)
            return Split(self.train.x[idx], self.train.y[idx], [len(r) for r in rows])

        return replace(self, train=take(keep), holdout=take(held))

    def tiled(self, copies: int) -> FederatedData:
        """The federation with every client `copies` times over the same rows: client i of copy c is client c·N + i
        (a pack's runs: tuner/engine/pack.py)."""
        split = lambda s: None if s is None else s.tiled(copies)  # noqa: E731
        return replace(
            self,
            train=self.train.tiled(copies),
            test=self.test.tiled(copies),
            val=split(self.val),
            holdout=split(self.holdout),
            group=np.tile(self.group, copies),
            client_names=self.client_names * copies if self.client_names else None,
        )

    def label_counts(self) -> np.ndarray:
        """(clients, classes) training-label histogram."""
        out = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        y = self.train.y.cpu().numpy()
        for i in range(self.num_clients):
            a, b = self.train.offsets[i], self.train.offsets[i + 1]
            out[i] = np.bincount(y[a:b], minlength=self.num_classes)
        return out


def build(ds: Dataset, part: Partition, shift: str, seed: int, normalize: str, device: torch.device) -> FederatedData:
    if shift not in SHIFTS:
        raise UserError(f"Unknown shift '{shift}'; choose one of {', '.join(SHIFTS)}.")
    if shift == "rotate" and ds.kind != "image":
        raise UserError(f"shift=rotate needs an image dataset; {ds.name} holds {ds.kind} data.")
    groups = int(part.group.max()) + 1 if len(part.group) else 1
    gen = np.random.default_rng(seed + 7919)
    # Concept shift: group g relabels class c as perm[g][c]; group 0 keeps the true labels.
    perms = [np.arange(ds.num_classes)] + [gen.permutation(ds.num_classes) for _ in range(groups - 1)]

    def make(parts: list[np.ndarray]) -> Split:
        xs, ys = [], []
        for i, idx in enumerate(parts):
            idx_t = torch.from_numpy(np.asarray(idx, dtype=np.int64))
            x, y = ds.x[idx_t], ds.y[idx_t]
            g = int(part.group[i])
            if shift == "concept":
                y = torch.from_numpy(perms[g])[y]
            elif shift == "rotate" and g > 0 and len(x):
                from torchvision.transforms.functional import rotate

                x = rotate(x, angle=360.0 * g / groups)  # feature skew: group g sees images rotated by g/G of a turn
            xs.append(x)
            ys.append(y)
        return Split(torch.cat(xs).to(device), torch.cat(ys).to(device), [len(p) for p in parts])

    val = make(part.val) if any(len(v) for v in part.val) else None
    names = [ds.client_ids[o] for o in part.owners] if part.owners is not None and ds.client_ids else None
    return FederatedData(
        make(part.train),
        make(part.test),
        val,
        ds.num_classes,
        ds.input_shape,
        part.group,
        decode(ds, normalize),
        ds.vocab,
        client_names=names,
    )
