"""Trials of a sweep sharing a device as packs (tuner/engine/pack.py): `tuner sweep --pack N`.

The sweep starts a `PackHost`, a Ray actor, on each device of the cluster (each GPU, or each node without one);
the runs of the trials placed on it live there. Each trial stays a Ray Tune trial, reporting its own rounds,
checkpointed, stopped by its scheduler, exploited and restored as any other; it reaches its run through a
`HostedRun`, which has a Simulation's face (step, history, round, state_dict, load_state_dict). A trial asks for its
next round; the host steps together every trial waiting at that round whose runs are one program, as soon as every
trial it holds at that round has asked, or, for one that has not asked within GATHER_S (killed without a word),
without it; trials at their first round wait for trials starting beside them, until the pack is full or none has
joined for START_S. A trial that ends (finished, stopped by ASHA, failed) leaves the host, and the trial that takes its
slot joins the next pack at its own round. Who steps with whom never changes a number: a packed run equals the run
alone (tests/test_pack.py), so the grouping is for speed only."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from tuner.engine.pack import Pack
from tuner.errors import DivergedError, UserError
from tuner.settings.config import RunPlan, resolve_layers

GATHER_S = 2.0  # how long a pack waits for a trial it holds at its round: far above a round's report to Tune
START_S = 5.0  # trials at their first round wait for more to join until none has for this long (or the pack is full)
# --pack auto by device: on a CPU a pack gains about nothing a core and a packed sweep ran slower than today's
# (results/bench/packing-digits.json, docs/performance.md "Packs"), so auto packs nothing there; on a GPU 8, not yet
# measured (bench/packing.py --device cuda)
AUTO_PACK = {"cpu": 1, "cuda": 8}
PACK_TRIAL_CPUS = 0.05  # what a trial of a packed sweep asks for: it waits on its host, which computes


@dataclass
class Member:
    """A trial's run in the host: its plan, its round, its state while it is in no pack, and its round's row."""

    plan: RunPlan
    program: str  # runs of one program (pack_signature) may pack
    round: int = 0
    parked: dict | None = None
    waiting: bool = False
    absent: bool = False  # missed a pack's gathering: not waited for until it asks again
    row: dict | None = None
    failure: Exception | None = None


def pack_signature(plan: RunPlan) -> str:
    """What runs of one pack share: every setting but their seeds and numbers, and which numbers are 0."""
    from tuner.packed_run import PACKED_APART

    fixed = {k: v for k, v in asdict(plan).items() if k not in PACKED_APART}
    numbers = {k: (v == 0) if isinstance(v, float) else v for k, v in plan.hparams.items()}
    return repr((sorted(fixed.items()), sorted(numbers.items()), plan.momentum == 0, plan.weight_decay == 0))


class PackHost:
    """The runs of the trials on one device, stepped as packs (the module's docstring). A threaded Ray actor: each
    trial's call waits in its own thread."""

    def __init__(self, size: int, threads: int, compile_cache: str):
        import ray
        import torch

        from tuner.engine.compile import use_cache

        use_cache(compile_cache)
        torch.set_num_threads(max(1, threads))
        self.device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
        self.node = ray.get_runtime_context().get_node_id()
        self.cond = threading.Condition()
        self.members: dict[str, Member] = {}
        self.pack: Pack | None = None
        self.pack_members: list[str] = []
        self.busy = False
        self.size = size  # the most runs a pack holds
        self.joined = time.monotonic()  # when a trial last joined
        self.data: dict[str, Any] = {}  # each program's data, loaded once

    def load_of(self) -> tuple[str, int]:
        """Its node and how many trials it holds (a trial joins the least held host of its node)."""
        return self.node, len(self.members)

    def attach(self, member: str, settings: dict[str, Any], worker_rounds: int) -> None:
        """A trial's run joins at round 0 (a trial started again takes its old place's id: the old place goes)."""
        settings = dict(settings)
        if settings.get("device", "auto") == "auto":
            settings["device"] = self.device
        plan = resolve_layers(settings.pop("method"), [("trial", settings)], worker_rounds)
        with self.cond:
            self._leave(member)
            self.members[member] = Member(plan, pack_signature(plan))
            self.joined = time.monotonic()

    def detach(self, member: str) -> None:
        with self.cond:
            self._leave(member)
            self.cond.notify_all()

    def load_state_dict(self, member: str, state: dict) -> None:
        with self.cond:
            self._release_pack_of(member)
            m = self._member(member)
            m.parked, m.round = state, state["round"]

    def state_dict(self, member: str) -> dict:
        with self.cond:
            m = self._member(member)
            if member in self.pack_members and self.pack is not None:
                return self.pack.state_dict(self.pack_members.index(member))
            if m.parked is not None:
                return m.parked
        return self._fresh(m).state_dict(0)

    def step(self, member: str) -> dict:
        """The trial's next round, stepped with every trial ready at that round (the module's docstring); its row."""
        with self.cond:
            me = self._member(member)
            me.waiting, me.absent, me.row, me.failure = True, False, None, None
            deadline = time.monotonic() + GATHER_S
            self.cond.notify_all()
            group = None
            while me.row is None and me.failure is None:
                group = None if self.busy else self._ready(me, deadline)
                if group is not None:
                    self.busy = True
                    break
                self.cond.wait(timeout=0.05)  # the gathering's clocks are checked again at least this often
        if group is not None:
            self._step_group(group)
        with self.cond:
            if me.failure is not None:
                raise me.failure
            row, me.row = me.row, None
            assert row is not None
            return row

    # --- inside the host
    def _member(self, member: str) -> Member:
        if member not in self.members:  # the host was killed and started again since the trial attached
            raise RuntimeError("the trial's pack host started again without its run; Tune restarts the trial")
        return self.members[member]

    def _ready(self, me: Member, deadline: float) -> list[str] | None:
        """The trials to step with `me`, once every one held at its round has asked or the gathering has ended."""
        peers = [k for k, m in self.members.items() if m.round == me.round and m.program == me.program]
        waiting = sorted(k for k in peers if self.members[k].waiting)[: self.size]
        missing = [k for k in peers if not self.members[k].waiting and not self.members[k].absent]
        now = time.monotonic()
        if len(waiting) < self.size and me.round == 0 and now - self.joined < START_S:
            return None  # more trials may be starting
        if missing and len(waiting) < self.size and now < deadline:
            return None
        for k in missing:
            self.members[k].absent = True
        return waiting

    def _step_group(self, group: list[str]) -> None:
        try:
            pack = self._pack_of(group)
            rows: list[dict | Exception] = list(pack.step())
        except Exception as e:  # every trial of the pack fails with it, as it would alone
            rows = [e] * len(group)
        with self.cond:
            for k, row in zip(group, rows, strict=True):
                m = self.members.get(k)
                if m is None:  # it left meanwhile
                    continue
                m.waiting = False
                if isinstance(row, Exception):
                    m.failure = row
                    continue
                m.round, m.row = row["round"], row
            self.busy = False
            self.cond.notify_all()

    def _pack_of(self, group: list[str]) -> Pack:
        """The pack of these trials: the one stepped last, or a new one holding their states."""
        with self.cond:
            if self.pack is not None and self.pack_members == group:
                return self.pack
            self._release()
            members = [self.members[k] for k in group]
        pack = self._packed([m.plan for m in members], members[0].program)
        with self.cond:
            for r, m in enumerate(members):
                if m.parked is not None:
                    pack.load_state_dict(r, m.parked)
                    m.parked = None
            self.pack, self.pack_members = pack, group
        return pack

    def _fresh(self, m: Member) -> Pack:
        return self._packed([m.plan], m.program)

    def _packed(self, plans: list[RunPlan], program: str) -> Pack:
        """A pack of these runs, on their program's data, loaded once."""
        from tuner.federated_run import planned_data
        from tuner.packed_run import planned_pack

        if program not in self.data:
            self.data[program] = planned_data(plans[0], None)[1]
        return planned_pack(list(plans), self.data[program])[1]

    def _release(self) -> None:
        """Every run of the current pack back to its own state (the pack is about to change)."""
        if self.pack is not None:
            for r, k in enumerate(self.pack_members):
                if k in self.members:
                    self.members[k].parked = self.pack.state_dict(r)
        self.pack, self.pack_members = None, []

    def _release_pack_of(self, member: str) -> None:
        """The member's pack released, once a round it is stepping (a restarted trial's old place) has ended: its
        states are whole only between rounds."""
        while self.busy and member in self.pack_members:
            self.cond.wait()
        if member in self.pack_members:
            self._release()

    def _leave(self, member: str) -> None:
        self._release_pack_of(member)
        self.members.pop(member, None)


def start_hosts(size: int, cpus: float, compile_cache: str) -> list:
    """A PackHost on each device of the cluster: each GPU (holding it whole), or each node without one (holding
    `cpus` of it); each packs up to `size` trials. A host lost with its node is not started elsewhere: its trials,
    restarted by Tune on other nodes, join those nodes' hosts (least_held)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    host = ray.remote(PackHost)
    hosts = []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        gpus, room = int(node["Resources"].get("GPU", 0)), node["Resources"].get("CPU", 0)
        if cpus + size * PACK_TRIAL_CPUS > room:
            raise UserError(
                f"--pack {size} with --cpus-per-trial {cpus:g} needs {cpus + size * PACK_TRIAL_CPUS:g} CPUs on a node "
                f"(the pack's {cpus:g}, and {PACK_TRIAL_CPUS:g} a waiting trial), and one has {room:g}; lower "
                "--cpus-per-trial or --pack."
            )
        for _ in range(gpus or 1):
            hosts.append(
                host.options(
                    num_cpus=cpus,
                    num_gpus=1 if gpus else 0,
                    max_concurrency=1000,  # every trial's call waits in a thread of its own
                    # a host killed (the OOM killer) starts again, empty: its trials fail their call, and Tune
                    # restarts each from its checkpoint into it (TRIAL_RETRIES bounds how often)
                    max_restarts=-1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                ).remote(size, math.ceil(cpus), compile_cache)
            )
    return hosts


def stop_hosts(hosts: list) -> None:
    import ray

    for h in hosts:
        ray.kill(h)


def least_held(hosts: list, node: str) -> Any:
    """The living host of `node` holding the fewest trials (any node's where it has none): a host lost with its
    node is passed over, so a trial restarted from its checkpoint joins another."""
    import ray

    loads = {}
    for i, h in enumerate(hosts):
        try:
            loads[i] = ray.get(h.load_of.remote())
        except ray.exceptions.RayActorError:
            continue
    if not loads:
        raise UserError("Every pack host of the sweep is gone (its nodes lost); --resume starts new ones.")
    mine = [i for i, (at, _) in loads.items() if at == node] or list(loads)
    return hosts[min(mine, key=lambda i: loads[i][1])]


class HostedRun:
    """A trial's run in a PackHost, with a Simulation's face: what the trainable reads and calls."""

    def __init__(self, host: Any, member: str, settings: dict[str, Any], worker_rounds: int):
        import ray

        self.host, self.member, self.ray = host, member, ray
        ray.get(host.attach.remote(member, settings, worker_rounds))
        self.history: list[dict] = []
        self.round = 0

    def step(self) -> dict:
        row = self.ray.get(self.host.step.remote(self.member))
        if "diverged" in row:
            raise DivergedError(row["diverged"])
        self.history.append(row)
        self.round = row["round"]
        return row

    def state_dict(self) -> dict:
        return self.ray.get(self.host.state_dict.remote(self.member))

    def load_state_dict(self, state: dict) -> None:
        self.ray.get(self.host.load_state_dict.remote(self.member, state))
        self.round, self.history = state["round"], list(state["history"])

    def close(self) -> None:
        self.host.detach.remote(self.member)
