"""A Ray Tune trial's settings: its stage's fixed ones, its grouped and sampled values, resolved into a run; and how
often a trial that dies is restarted."""

from __future__ import annotations

from typing import Any

from tuner.settings.config import RunPlan, resolve_layers

# A trial that dies (its worker killed by the OOM killer, a node lost) restarts from its last checkpoint this
# many times before Ray Tune gives up on it (max_failures); a diverging one is not retried (sweep.FinalFailures).
TRIAL_RETRIES = 2


def trial_settings(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A Tune trial's settings: its stage's fixed settings (with the method), then its grouped values (a dict: a
    table cell, a seed with its partition seed), then its single sampled values."""
    groups = [v for v in params.values() if isinstance(v, dict)]
    return {
        **base,
        **{k: v for g in groups for k, v in g.items()},
        **{k: v for k, v in params.items() if not isinstance(v, dict)},
    }


def trial_config(base: dict[str, Any], params: dict[str, Any], worker_rounds: int | None = None) -> RunPlan:
    """A Tune trial's run, planned (trial_settings); `worker_rounds`: the rounds all the trials of its worker run,
    which engine auto weighs (they share the worker's compiled programs)."""
    settings = trial_settings(base, params)
    method = settings.pop("method")
    return resolve_layers(method, [("trial", settings)], worker_rounds)
