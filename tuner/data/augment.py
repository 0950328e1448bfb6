"""FedPAC's CIFAR/CINIC augmentation as tensor operations: random crop with 4 pixels of zero
padding, and a random horizontal flip (torchvision's RandomCrop(32, padding=4) and
RandomHorizontalFlip on the stored uint8 pixels, before normalization).

The draws are a function of (seed, round, stream, client), like the batch order, so both
executors augment a client identically; the crop and flip are one gather, so a whole cohort's
batches (any leading shape) go through at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD = 4


def augment_draws(seed_state: int, steps: int, batch: int) -> torch.Tensor:
    """(steps, batch, 3) long: row offset, column offset (0..2·PAD) and flip (0/1) of every training sample."""
    g = torch.Generator().manual_seed(seed_state)
    offsets = torch.randint(0, 2 * PAD + 1, (steps, batch, 2), generator=g)
    flips = torch.randint(0, 2, (steps, batch, 1), generator=g)
    return torch.cat([offsets, flips], dim=-1)


def crop_flip(x: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Crop and flip images x (..., C, H, W) by draws (..., 3) with the same leading shape."""
    lead, (c, h, w) = x.shape[:-3], x.shape[-3:]
    flat = x.reshape(-1, c, h, w)
    d = draws.reshape(-1, 3).to(x.device)
    padded = F.pad(flat, (PAD, PAD, PAD, PAD))
    rows = d[:, :1] + torch.arange(h, device=x.device)  # (N, H)
    cols = d[:, 1:2] + torch.arange(w, device=x.device)  # (N, W)
    cols = torch.where(d[:, 2:].bool(), cols.flip(1), cols)
    n = torch.arange(len(flat), device=x.device)[:, None, None]
    out = padded[n, :, rows[:, :, None], cols[:, None, :]]  # (N, H, W, C): advanced indices first
    return out.permute(0, 3, 1, 2).reshape(*lead, c, h, w)
