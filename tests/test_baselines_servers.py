"""Baselines whose server does more than average: FedFomo's and pFedHN's, the server optimizers (FedAdam, FedYogi,
server SGD); and no method silently equal to another."""

import pytest
import torch
from simulations import client, digits, reference_run, sim_for

from algorithms import METHODS
from tuner.federated_run import build_simulation
from tuner.settings.config import RunConfig


def test_fedfomo_weighs_candidates_on_held_out_data_against_the_model_it_began_training_from():
    sim = sim_for("fedfomo", 0, join_ratio="1", hparams={"m": 3})
    counts, held = sim.data.train.counts, sim.data.holdout.counts
    assert all(h == int(0.2 * (c + h)) for c, h in zip(counts, held, strict=True))  # 20 % held out, never trained on
    assert torch.equal(sim.server["fomo.affinity"], torch.eye(6))  # a client's own stored model is its first candidate
    assert sim.clients["fomo.chosen"][0].tolist()[0] == 0
    m, k = sim.method, sim.method.net.param_keys[0]
    state = client(sim, 0)
    stats = {"old": torch.tensor(10.0), "others": torch.tensor([5.0, 20.0, 10.0]), "n": torch.tensor(1.0)}
    out = m.begin_local(state, sim.server, stats, sim.at(1, [0]).client(0))
    chosen = state["fomo.chosen"]
    gaps = torch.stack(
        [
            sum(((sim.server["fomo.models." + q][j] - state["fomo.old." + q]) ** 2).sum() for q in m.net.param_keys)
            for j in chosen
        ]
    ).sqrt()
    # eq. 3, raw: P adds these
    torch.testing.assert_close(out["fomo.weights"], torch.tensor([5.0, -10.0, 0.0]) / (gaps + 1e-5))
    # eq. 4: only the candidate that lowers the loss
    torch.testing.assert_close(out[k], sim.server["fomo.models." + k][chosen[0]])
    torch.testing.assert_close(out["fomo.old." + k], out[k])  # the next round weighs against this model


def test_fedfomo_combines_similar_clients_models():
    sim = sim_for("fedfomo", 2, join_ratio="1", partition="iid", hparams={"m": 3})
    weights, chosen = sim.clients["fomo.weights"], sim.clients["fomo.chosen"]
    others = chosen != torch.arange(6)[:, None]
    assert (weights[others] > 0).any()  # another client's model lowered a client's validation loss, and was taken
    affinity = sim.server["fomo.affinity"] - torch.eye(6)
    assert (affinity[~torch.eye(6, dtype=torch.bool)] > 0).any()  # and is remembered


def test_pfedhn_server_step_moves_the_generated_model_towards_the_trained_one():
    sim = sim_for("pfedhn", hparams={"hn_lr": 1e-3})  # a small step: first order, it must descend
    m, keys = sim.method, sim.method.net.param_keys
    ids = torch.tensor([0, 3])
    generated = {k: torch.stack([m.generate(sim.server, i)[k] for i in ids]) for k in keys}
    torch.testing.assert_close(sim.clients[keys[0]][3], generated[keys[0]][1])  # clients hold their generated models
    trained = {k: v - 0.01 * torch.randn_like(v) for k, v in generated.items()}
    server = m.aggregate(sim.server, trained, sim.at(1, ids.tolist()))
    distance = lambda s: sum(((m.generate(s, ids[0])[k] - trained[k][0]) ** 2).sum() for k in keys)  # noqa: E731
    assert distance(server) < distance(sim.server)
    assert all(k.startswith(("hn.", "hn_momentum.")) for k in server)  # no model weights on the server, only φ


def test_pfedhn_hypernetwork_is_the_reference_cnnhyper_four_linear_layers_and_no_final_relu():
    from torch import nn

    mlp = sim_for("pfedhn").method.hypernetwork.mlp
    assert [type(m) for m in mlp] == [
        nn.Linear,
        nn.ReLU,
        nn.Linear,
        nn.ReLU,
        nn.Linear,
        nn.ReLU,
        nn.Linear,
    ]  # n_hidden = 3


def test_pfedhn_steps_after_each_client_in_order_with_the_gradient_clipped_at_50(monkeypatch):
    sim = sim_for("pfedhn", 0, join_ratio="1", executor="sequential")  # one client per map: plain indices to record
    m = sim.method
    steps, received = [], []
    aggregate, broadcast = m.aggregate, m.broadcast

    def recording_aggregate(server, uploads, at):
        steps.append(at.clients.tolist())
        return aggregate(server, uploads, at)

    def recording_broadcast(client, server, at):
        received.append((at.clients.tolist(), len(steps)))
        return broadcast(client, server, at)

    monkeypatch.setattr(m, "aggregate", recording_aggregate)
    monkeypatch.setattr(m, "broadcast", recording_broadcast)
    sim.step()
    assert steps == [[i] for i in range(6)]  # one hypernetwork step per client, in order
    assert [(i, n) for i, n in received if n < 6] == [(i, i) for i in range(1, 6)]  # client i receives φ after i steps

    phi = {k: v for k, v in sim.server.items() if k.startswith("hn.")}
    keys = m.net.param_keys
    trained = {k: (m.generate(sim.server, torch.tensor(0))[k] - 1e3)[None] for k in keys}  # a huge update
    zero = {k: torch.zeros_like(v) for k, v in sim.server.items() if k.startswith("hn_momentum.")}
    out = aggregate({**sim.server, **zero}, trained, sim.at(1, [0]))
    step = {k: (phi[k] - out[k]) / m.hp.hn_lr - 1e-3 * phi[k] for k in phi}  # the clipped gradient
    assert torch.sqrt(sum((v.double() ** 2).sum() for v in step.values())).item() == pytest.approx(50.0, rel=1e-4)


def trajectory(method):
    """Per-round (accuracy, training loss) of the shared float64 reference run."""
    return [(r["acc"], r["train_loss"]) for r in reference_run(method).history]


# Methods that are another in a limit their paper names.
LIMITS = {("fedcp-nocpn-nogfm-nogh", "fedper"): "FedCP §5.3: without CPN, GFM and the global head it is FedPer"}


def same_method(a, b):
    """The same method: a named limit, or a variant whose fixed hyperparameters are its family's defaults."""
    if (a, b) in LIMITS or (b, a) in LIMITS:
        return True
    ca, cb = METHODS[a], METHODS[b]
    family = lambda c: c.family or c.name  # noqa: E731
    if family(ca) != family(cb):
        return False
    return RunConfig(method=a).resolved().hparams == RunConfig(method=b).resolved().hparams


@pytest.mark.slow
@pytest.mark.xdist_group("reference_runs")  # where test_engine.py made every method's run: ~50 s of runs, not again
def test_no_method_silently_equals_another():
    # FedFomo once weighed its candidates on its own trained model and data: every weight was 0 and
    # it ran as Local-only under its own name, with every mechanism test passing.
    runs = {name: trajectory(name) for name in sorted(METHODS)}
    for a in runs:
        for b in runs:
            if a < b and not same_method(a, b):
                equal = all(
                    abs(x - y) < 1e-9
                    for ra, rb in zip(runs[a], runs[b], strict=True)
                    for x, y in zip(ra, rb, strict=True)
                )
                assert not equal, f"{a} runs exactly as {b}"
    for a, b in [*LIMITS, ("hypcluster", "hypcluster-k3")]:  # the limits hold
        assert all(
            abs(x - y) < 1e-9 for ra, rb in zip(runs[a], runs[b], strict=True) for x, y in zip(ra, rb, strict=True)
        ), (a, b)


@pytest.mark.parametrize("method", ["fedadam", "fedyogi"])
def test_fedadam_and_fedyogi_step_the_server_along_the_cohorts_mean_as_algorithm_2(method):
    hp = {"server_lr": 0.1, "beta1": 0.8, "beta2": 0.9, "tau": 0.01}
    sim = sim_for(method, 0, join_ratio="1", dtype="float64", hparams=hp)
    m, keys = sim.method, sim.method.net.param_keys
    g = torch.Generator().manual_seed(0)
    x = {k: sim.server[k].clone() for k in keys}
    m1, v1 = {k: torch.zeros_like(x[k]) for k in keys}, {k: torch.full_like(x[k], 0.01**2) for k in keys}
    server = sim.server
    for r in (1, 2):  # two rounds: the moments carry over
        uploads = {k: server[k] + torch.randn((6, *x[k].shape), generator=g, dtype=x[k].dtype) for k in keys}
        at = sim.at(r, list(range(6)))
        server = m.aggregate(server, uploads, at)
        for k in keys:
            w = at.samples / at.samples.sum()
            delta = torch.tensordot(w, uploads[k], dims=1) - x[k]  # Δ = x̄ − x
            m1[k] = 0.8 * m1[k] + 0.2 * delta
            if method == "fedadam":
                v1[k] = 0.9 * v1[k] + 0.1 * delta**2
            else:
                v1[k] = v1[k] - 0.1 * delta**2 * torch.sign(v1[k] - delta**2)
            x[k] = x[k] + 0.1 * m1[k] / (v1[k].sqrt() + 0.01)
            torch.testing.assert_close(server[k], x[k], rtol=1e-12, atol=1e-12)
    run = build_simulation(digits(method, rounds=2, dtype="float64", hparams=hp))
    run.step()
    assert all(not k.startswith("server_opt.") for k in run.clients)  # the moments stay on the server


def test_server_sgd_with_step_one_is_the_mean():
    from algorithms.optimizers import SGD

    sim = sim_for("fedavg", 0, join_ratio="1", dtype="float64")
    m, keys = sim.method, sim.method.net.param_keys
    uploads = {k: sim.clients[k] + torch.randn(sim.clients[k].shape, dtype=torch.float64) for k in keys}
    at = sim.at(1, list(range(6)))
    mean = m.aggregate(sim.server, uploads, at)
    m.server_optimizer = lambda: SGD(1.0)
    stepped = m.aggregate(sim.server, uploads, at)
    for k in keys:
        torch.testing.assert_close(stepped[k], mean[k], rtol=1e-12, atol=1e-12)
