"""The sequential float64 runs that several tests compare against (vectorized equals sequential; no method
silently equals another), made once per session: each is two rounds of one method on digits."""

from functools import lru_cache

from tuner.config import RunConfig
from tuner.run import build_simulation


def exact_config(method: str, **kw) -> RunConfig:
    """Float64 (rounding near 1e-14 can never pass for a real difference, 1e-2 and more); uneven clients
    (dir:0.3), partial participation drawn each round, a validation split; two rounds, so that what is
    uploaded in the first comes back."""
    base = dict(method=method, dataset="digits", partition="dir:0.3", clients=6, lr=0.05, join_ratio="0.5-1", val_frac=0.2,
                batch_size=40, rounds=2, dtype="float64")  # fmt: skip
    return RunConfig(**{**base, **kw})


@lru_cache(maxsize=None)
def reference_run(method: str):
    sim = build_simulation(exact_config(method, executor="sequential"))
    for _ in range(2):
        sim.step()
    return sim
