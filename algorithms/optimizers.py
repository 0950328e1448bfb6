"""The optimizers a method's phases and its server step with: SGD as torch.optim's, and the server's Adam and
Yogi of FedOpt. In place and fused over a dict of tensors; the numbers may be 0-dim tensors (the inputs of a
compiled step: algorithms.base.hyperparameter_inputs), or, in a pack of runs, a number for each row of the stacked
tensors (tuner/engine/pack.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.common import Number, State, is_on


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD's update (momentum without dampening, L2 weight decay), in place and fused over
    a dict of tensors as its foreach path does. Its state is the momentum buffers ({} without). The
    numbers may be 0-dim tensors (a compiled step's inputs: hyperparameter_inputs). `group_lrs` gives
    tensors under a prefix a learning rate of their own, as torch.optim's parameter groups (APPLE's
    coefficients beside its core model); `plain` steps tensors under a prefix without momentum or weight
    decay, as a second, plain torch.optim.SGD at the same rate (FedDBE's bias)."""

    lr: Number
    momentum: Number = 0.0
    weight_decay: Number = 0.0
    group_lrs: tuple[tuple[str, Number], ...] = ()  # (prefix, lr): these tensors step at this lr instead
    plain: tuple[str, ...] = ()  # prefixes of tensors stepped by the plain gradient

    def init(self, params: State) -> State:
        return (
            {k: torch.zeros_like(v) for k, v in params.items() if not k.startswith(self.plain)}
            if is_on(self.momentum)
            else {}
        )

    def for_rows(self, rest: State, server: State) -> SGD:
        """The optimizer a step of these rows applies: itself, or in a pack of runs each row's own numbers, read
        from the row's state and the pack's server (tuner/engine/pack.py)."""
        return self

    def step(self, params: State, grads: State, state: State) -> None:
        keys = list(params)
        held = [k for k in keys if not k.startswith(self.plain)]  # the rest step by their plain gradient
        p = [params[k] for k in held]
        d = [grads[k] for k in held]
        if is_on(self.weight_decay):
            d = torch._foreach_add(d, torch._foreach_mul(p, by_row(self.weight_decay, p)))
        if is_on(self.momentum):
            buf = [state[k] for k in held]
            torch._foreach_mul_(buf, by_row(self.momentum, buf))
            torch._foreach_add_(buf, d)
            d = buf
        direction = {**{k: grads[k] for k in keys}, **dict(zip(held, d, strict=True))}
        # keyed by prefix, never by the lr itself: a compiled step guards on what it reads
        groups: dict[str, list[str]] = {}
        for key in keys:
            groups.setdefault(next((prefix for prefix, _ in self.group_lrs if key.startswith(prefix)), ""), []).append(
                key
            )
        lrs = dict(self.group_lrs)
        for prefix, group in groups.items():  # one fused update per learning rate
            moves = [direction[k] for k in group]
            torch._foreach_sub_(
                [params[k] for k in group], torch._foreach_mul(moves, by_row(lrs.get(prefix, self.lr), moves))
            )


def by_row(number: Number, tensors: list[torch.Tensor]) -> Number | list[torch.Tensor]:
    """A number as _foreach_mul takes it: a number or 0-dim tensor as it is; a pack's number a row, (rows,), viewed
    against each stacked tensor (rows, ...), so each row is multiplied by its own, the same product as alone."""
    if not isinstance(number, torch.Tensor) or number.dim() == 0:
        return number
    return [number.view(-1, *[1] * (t.dim() - 1)) for t in tensors]


@dataclass(frozen=True)
class Adam:
    """The server's Adam of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2:
    m ← β1 m + (1 − β1) g, v ← β2 v + (1 − β2) g², x ← x − η m / (√v + τ), from v = τ² and without
    bias correction, as the paper writes it (Flower starts v at 0 and corrects the bias). In place,
    as SGD; its state holds m ("m.KEY") and v ("v.KEY")."""

    lr: Number
    beta1: Number = 0.9
    beta2: Number = 0.99
    tau: Number = 1e-3

    def init(self, params: State) -> State:
        return {
            **{"m." + k: torch.zeros_like(v) for k, v in params.items()},
            **{"v." + k: torch.zeros_like(v) + self.tau**2 for k, v in params.items()},
        }

    def step(self, params: State, grads: State, state: State) -> None:
        for k, p in params.items():
            g, m, v = grads[k], state["m." + k], state["v." + k]
            m.mul_(self.beta1).add_((1 - self.beta1) * g)
            self.second_moment(v, g * g)
            p.sub_(self.lr * m / (v.sqrt() + self.tau))

    def second_moment(self, v: torch.Tensor, g2: torch.Tensor) -> None:
        v.mul_(self.beta2).add_((1 - self.beta2) * g2)


class Yogi(Adam):
    """Adam with Yogi's second moment (Reddi et al. 2021, Algorithm 2): v ← v − (1 − β2) g² sign(v − g²)."""

    def second_moment(self, v: torch.Tensor, g2: torch.Tensor) -> None:
        v.sub_((1 - self.beta2) * g2 * torch.sign(v - g2))
