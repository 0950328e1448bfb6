"""FedCross (Hu et al., ICDE 2024): multi-model cross-aggregation; K middleware models instead of one global model.

Shared: K middleware models on the server, K the largest cohort ("cross.m.", stacked). Personal: the
client's model, the middleware it trained last.
Each round the cohort's clients take the middleware models one each, in a keyed random order, and train
them (CE). Server: each trained model replaces its middleware; then each middleware j is cross-aggregated
with the one least similar to it, w_j ← α w_j + (1 − α) w_c(j) (collaborative model selection by lowest
similarity, the reference's default). The similarity is PFLlib's `calculate_similarity`: over the model's
`state_dict()` entries in order, batch-norm statistics included, the sum of the cosines of consecutive
pairs of the two models' tensors, then the last pair once more where the count is even, or the last
tensor alone once where it is odd. A middleware's statistics are the initial model's throughout, as in
PFLlib, whose clients copy parameters only into and out of it.
Prediction: the client's model as it last trained it (as PFLlib evaluates FedCross's clients).

Sources: PFLlib clientcross.py / servercross.py (α = 0.99, first_stage_bound 0, strategy 1). Differences:
the cohort's order, which decides who trains which middleware, is a keyed draw of the run's seed and round
(PFLlib's numpy draw); the reference also averages the uploads into a global model that nothing reads
under these settings, left out here. The paper evaluates a fused global model; PFLlib's numbers, the
clients' own.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms.base import Method, Unsupported
from algorithms.common import uniform

MIDDLEWARE = "cross.m."
STATISTICS = "cross.s."  # the middleware models' batch-norm statistics: the initial model's, never changed


@dataclass
class FedCrossHparams:
    alpha: float = 0.99  # α, the middleware's own share in cross-aggregation (PFLlib's default)


class FedCross(Method):
    name = "fedcross"
    title = "FedCross"
    origin = "roster"
    paper = "Hu et al., ICDE 2024"
    source = "PFLlib clientcross.py"
    Hparams = FedCrossHparams
    shared = ()
    unpackable = "each client's middleware is drawn from its run's seed and cohort as its round begins"

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        # the largest cohort (tuner.engine.draws.sample_cohort)
        self.models = min(training.clients, max(1, round(training.federation.participation_max * training.clients)))
        if self.models < 2:
            raise Unsupported(
                "FedCross cross-aggregates the models of at least two clients a round: raise join_ratio or "
                "the number of clients."
            )
        self.entries = list(net.module.state_dict())  # state_dict's order: parameters and statistics, module by module

    def init_server(self, model):
        middleware = {
            MIDDLEWARE + k: model[k].unsqueeze(0).repeat(self.models, *[1] * model[k].dim()).clone()
            for k in self.net.param_keys
        }
        return {**middleware, **{STATISTICS + k: model[k].clone() for k in self.net.buffer_keys}}

    def positions(self, at) -> torch.Tensor:
        """Which middleware each client of the round's group trains: its place in a keyed shuffle of the group."""
        key = torch.tensor(
            (self.training.seed * 1_000_003 + at.number) % 2**32, dtype=torch.int64, device=at.group.device
        )
        order = torch.argsort(uniform(key, (len(at.group),), torch.float64))
        return torch.argsort(order)  # the rank of each group member in the shuffle

    def begin_local(self, client, server, stats, at):
        slot = self.positions(at)[(at.group == at.clients).to(torch.int64).argmax()]
        return {k: server[MIDDLEWARE + k][slot] for k in self.net.param_keys}

    def upload(self, client, server):
        return {k: client[k] for k in self.net.param_keys}

    def similarity(self, models: dict, statistics: dict) -> torch.Tensor:
        """(K, K): Σ over consecutive pairs of state_dict entries of the cosine of the two models' pair, and the
        last pair once more (an even count) or nothing more (odd: the last entry alone was one term), as
        PFLlib's calculate_similarity."""
        k_models, dtype = len(next(iter(models.values()))), next(iter(models.values())).dtype
        flat = {
            k: models[k].flatten(1) if k in models else statistics[k].to(dtype).flatten().expand(k_models, -1)
            for k in self.entries
        }
        groups = [self.entries[i : i + 2] for i in range(0, len(self.entries), 2)]
        total = 0
        for group in groups + (groups[-1:] if len(self.entries) % 2 == 0 else []):
            pair = torch.cat([flat[k] for k in group], 1)
            total = total + F.cosine_similarity(pair[:, None, :], pair[None, :, :], dim=-1)
        return total

    def aggregate(self, server, uploads, at):
        models = {k: server[MIDDLEWARE + k].index_put((self.positions(at),), uploads[k]) for k in self.net.param_keys}
        sim = self.similarity(models, {k: server[STATISTICS + k] for k in self.net.buffer_keys})
        k_models = sim.shape[0]
        partner = []
        for j in range(k_models):  # PFLlib's scan: starts from the next model, moves on strictly lower similarity
            best = (j + 1) % k_models
            for p in range(k_models):
                if p != j and sim[j, p] < sim[j, best]:
                    best = p
            partner.append(best)
        partner = torch.tensor(partner, device=sim.device)
        a = self.hp.alpha
        return {**server, **{MIDDLEWARE + k: a * v + (1 - a) * v[partner] for k, v in models.items()}}
