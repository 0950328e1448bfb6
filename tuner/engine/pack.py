"""A pack: P runs of one method and setting trained as one federation of P·N clients.

Runs of one method and setting differ only in their seeds, the values of their numbers and their state, so a pack is
the same round over more clients: client i of run r is row r·N + i of every client tensor, trained by the same
executor calls (one vmap, one compiled program, over every run's cohort at once). What stays each run's own:

- its draws: its cohort, batch order, augmentation and noise are keyed by its own seed and its clients' own ids
  (EngineSettings.pack_seeds, Executor.draw_id), so a packed run draws what it draws alone;
- its server: the pack's server holds each run's tensors stacked, `run.KEY` (runs, ...); a row's hooks read its own
  run's (`pack.run` in the row's state picks it), and each run aggregates its own uploads with its own method, a loop
  over runs (so a server written in Python, FedPAC's QP, runs as alone);
- its numbers: every nonzero float of its hyperparameters and its lr, momentum and weight decay, and each phase's
  optimizer numbers, are `number.NAME` (runs,) in the pack's server; a row's hooks read its own, put on the method
  while the hook runs (so `self.hp.lam` reads the row's), and its optimizer steps with its own (`RowSGD`);
- its initial model (drawn from its seed), its figures, history and checkpoint, which are those it has alone.

Runs pack when they are one program: the same method, data, backbone and settings but for the seed and the values of
nonzero numbers (a number 0 in one run and not in another makes two programs). A method that cannot be packed says
why (`Method.unpackable`); its runs run alone."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import torch

from algorithms.base import Method, State, hyperparameter_inputs
from algorithms.capabilities import HeldOut
from tuner.data.federated import FederatedData
from tuner.engine.draws import sample_cohort
from tuner.engine.executors import EngineSettings
from tuner.engine.packed_method import (
    NUMBER,
    RUN,
    SERVER,
    pack_problem,
    packed_method,
    runs_numbers,
)
from tuner.engine.simulation import Rounds, diverged, initial_states, metrics_row
from tuner.errors import UserError


class Pack(Rounds):
    """P runs of one method and setting as one federation, a round of every run at a time; each run's figures,
    history and checkpoint as it has them alone."""

    def __init__(self, methods: list[Method], data: FederatedData, settings: EngineSettings):
        """Raises ValueError with pack_problem's clause where the runs are not one program."""
        if isinstance(methods[0], HeldOut):
            data = data.hold_out(methods[0].holdout)
        runs, servers, clients = [], [], []
        for method in methods:
            model = method.net.initial_state()
            dtype = next(v.dtype for v in model.values() if v.is_floating_point())
            run = hyperparameter_inputs(method, next(iter(model.values())).device, dtype)
            server, client = initial_states(run, model)
            runs.append(run)
            servers.append(server)
            clients.append(client)
        problem = pack_problem(runs)
        if problem:
            raise ValueError(problem)
        n, p = data.num_clients, len(runs)
        self.runs, self.per_run = runs, n
        stacked = {
            NUMBER + name: torch.stack(values)
            for name, values in runs_numbers(runs).items()
            if isinstance(values[0], torch.Tensor)
        }
        server_state = {SERVER + k: torch.stack([s[k] for s in servers]) for k in servers[0]} | stacked
        client_state = {
            k: torch.cat([c[k].unsqueeze(0).expand(n, *c[k].shape) for c in clients]).contiguous() for k in clients[0]
        }
        client_state[RUN] = torch.arange(p, device=self.device_of(client_state)).repeat_interleave(n)
        settings = replace(settings, pack_seeds=tuple(r.training.seed for r in runs))
        super().__init__(packed_method(runs, n), data.tiled(p), settings, server_state, client_state)
        self.histories: list[list[dict]] = [[] for _ in runs]
        self.best_acc = [-math.inf] * p

    @staticmethod
    def device_of(state: State) -> torch.device:
        return next(iter(state.values())).device

    def rows_of(self, run: int) -> slice:
        return slice(run * self.per_run, (run + 1) * self.per_run)

    def step(self) -> list[dict]:
        """Run one round of every run; each run's metrics row, as it has it alone (its time_s the pack's round). A
        run whose training loss stops being finite does not stop the others: its row holds `diverged`, what its
        DivergedError says alone, and its history stays as it was."""
        t0 = time.perf_counter()
        ran = replace(self.executor.ran)
        rnd, s, n = self.round + 1, self.settings, self.per_run
        last = s.full_last_round and rnd == self.method.training.rounds
        cohorts = [sample_cohort(r.training.seed, rnd, n, s.join_ratio, last) for r in self.runs]
        ids = [r * n + i for r, cohort in enumerate(cohorts) for i in cohort]
        client_loss = self._train(rnd, ids)
        rows: list[dict[str, Any]] = []
        start = 0
        for r, cohort in enumerate(cohorts):
            loss = client_loss[start : start + len(cohort)]
            start += len(cohort)
            samples = torch.tensor([self.data.train.counts[i] for i in cohort], dtype=torch.float64)
            train_loss = float((loss * samples).sum() / samples.sum())
            rows.append({"round": rnd, "clients": len(cohort), "train_loss": train_loss})
            if not math.isfinite(train_loss):
                rows[-1]["diverged"] = diverged(self.runs[r], rnd, train_loss)
        self.round = rnd
        self._broadcast(list(range(self.data.num_clients)))
        if rnd % s.eval_gap == 0:
            sums = self._evaluation_sums()
            for r, row in enumerate(rows):
                part = self.rows_of(r)
                row.update(metrics_row([(pre, {k: v[part] for k, v in t.items()}, c[part]) for pre, t, c in sums]))
        engine, seconds = self.executor.ran.since(ran), time.perf_counter() - t0
        for r, row in enumerate(rows):
            self.best_acc[r] = max(self.best_acc[r], row.get("acc", -math.inf))
            row["best_acc"] = self.best_acc[r] if self.best_acc[r] > -math.inf else math.nan
            row |= {"engine": engine, "time_s": seconds, "pack": len(self.runs)}
            if "diverged" not in row:
                self.histories[r].append(row)
        return rows

    def state_dict(self, run: int) -> dict:
        """Run `run`'s state, as its Simulation alone saves it (so either resumes the other's); copies, never views of
        the pack's tensors, which the pack's next round writes into."""
        return {
            "round": self.round,
            "server": {
                k.removeprefix(SERVER): v[run].to("cpu", copy=True)
                for k, v in self.server.items()
                if k.startswith(SERVER)
            },
            "clients": {k: v[self.rows_of(run)].to("cpu", copy=True) for k, v in self.clients.items() if k != RUN},
            "history": list(self.histories[run]),
        }

    def load_state_dict(self, run: int, state: dict) -> None:
        """Run `run` from its saved state (its Simulation's or a pack's); every run of a pack is at one round."""
        if self.round and state["round"] != self.round:
            raise UserError(
                f"Runs packed together go on from one round; one checkpoint is at round {state['round']}, another "
                f"at {self.round}: resume them apart."
            )
        self.round = state["round"]
        for k, v in state["server"].items():
            self.server[SERVER + k][run] = v.to(self.device)
        for k, v in state["clients"].items():
            self.clients[k][self.rows_of(run)] = v.to(self.device)
        self.histories[run] = list(state["history"])
        self.best_acc[run] = max((h["acc"] for h in self.histories[run] if "acc" in h), default=-math.inf)
