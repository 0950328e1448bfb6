"""Idioms several methods share, written once: averages, sub-states, label counts, a plain
cross-entropy, per-client slots on the server, the MMD of FedCP and FedPHP, and keyed noise."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

State = dict[str, torch.Tensor]
# a float hyperparameter: a 0-dim tensor in a run, 0.0 where it is zero (hyperparameter_inputs)
Number = float | torch.Tensor


def is_on(value: Number) -> bool:
    """Whether a float hyperparameter switches its term on: a tensor is never zero (hyperparameter_inputs),
    so this reads no tensor's value and a compiled program branches only on what is static."""
    return isinstance(value, torch.Tensor) or value != 0


def weighted_mean(stacked: State, weights: torch.Tensor) -> State:
    """The mean of tensors stacked along dim 0, weighted (by the clients' sample counts)."""
    w = weights / weights.sum()
    return {k: torch.tensordot(w.to(v.dtype), v, dims=1) for k, v in stacked.items()}


def substate(state: State, prefix: str) -> State:
    """The tensors under `prefix`, with the prefix removed: what functional_call wants for a submodule."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def prefixed(module: nn.Module, prefix: str) -> State:
    """A module's initial parameters and buffers under `prefix`."""
    return {prefix + k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()}


def per_client(tensor: torch.Tensor, clients: int) -> torch.Tensor:
    """A server-side slot per client, each starting as `tensor` (read in broadcast at `at.clients`,
    written in aggregate with index_put)."""
    return tensor.unsqueeze(0).repeat(clients, *[1] * tensor.dim()).clone()


def class_sums(values: torch.Tensor, y: torch.Tensor, w: torch.Tensor, num_classes: int) -> State:
    """Per-class sums of the rows of `values` and per-class counts over one batch (w: 0 for padding): the
    statistics of class means (prototypes, class-average logits)."""
    onehot = (y[:, None] == torch.arange(num_classes, device=y.device)).to(values.dtype) * w[:, None]
    return {"sum": onehot.T @ values, "count": onehot.sum(0)}


def label_counts(y: torch.Tensor, w: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Weighted count of each label in a batch (w: 0 for padding)."""
    return ((y[:, None] == torch.arange(num_classes, device=y.device)).to(w.dtype) * w[:, None]).sum(0)


def cross_entropy(net, prefix: str = "") -> Callable[..., torch.Tensor]:
    """A phase loss: plain cross-entropy of the backbone under `prefix` (a second model: "global.")."""

    def loss(state: State, server: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net.logits(state, x, prefix), y)

    return loss


MMD_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)  # RBF bandwidths of FedCP's and FedPHP's reference code


def mmd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Maximum mean discrepancy of two equal-sized batches of features under a sum of RBF kernels."""

    def kernel(u, v):
        d = ((u[:, None, :] - v[None, :, :]) ** 2).sum(-1)
        return sum(torch.exp(-0.5 * d / h) for h in MMD_BANDWIDTHS)

    return kernel(a, a).mean() + kernel(b, b).mean() - 2 * kernel(a, b).mean()


# --- keyed noise: how a method draws (docs/engine.md, "How a method draws")
DRAW_KEY = "draw.key"  # a drawing method's loss and logits find their key under this name in the state

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for 0 <= x < 2**32, in int64 without overflow (16-bit halves of c)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer: a bijection that mixes every input bit into every output bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def uniform(key: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Uniform numbers in (0, 1) as a function of a 0-dim int64 key (32 bits) and each element's position:
    integer arithmetic, so the same on every device, under vmap and in a compiled step."""
    n = 1
    for d in shape:
        n *= d
    counter = torch.arange(n, device=key.device, dtype=torch.int64)
    bits = _hash32(_hash32(key) ^ _mul32(counter, 0x9E3779B9))
    return unit_interval(bits, dtype).view(shape)


def unit_interval(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """32 random bits as a number in (0, 1): (bits + ½) / 2³², kept below 1 where `dtype` rounds the largest up to it
    (float32 does for the top 2⁻²⁵ of draws: a Gumbel draw of it is infinite, a loss of it nan)."""
    return ((bits.to(dtype) + 0.5) / 2.0**32).clamp(max=1 - torch.finfo(dtype).eps / 2)


def gumbel(key: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Standard Gumbel noise, -log(-log U), keyed like `uniform`."""
    return -torch.log(-torch.log(uniform(key, shape, dtype)))
