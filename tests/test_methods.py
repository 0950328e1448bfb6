"""Small, exact tests of the mechanisms of GPFL, FedCP and FedPAC."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from simulations import client, sim_for

from algorithms import METHODS
from algorithms.fedpac import SimplexQPs
from algorithms.optimizers import SGD
from tuner.settings.config import RunConfig

# ------------------------------------------------------------------ GPFL


def test_gpfl_personal_input_weights_frozen_embeddings_by_label_frequency():
    sim = sim_for("gpfl", 1)
    m, state = sim.method, client(sim, 0)
    x, y = sim.data.train.client(0)
    freq = torch.bincount(y, minlength=10).float() / len(y)
    torch.testing.assert_close(state["gpfl.alpha"], freq)  # eq. 6
    g, p = m._conditions(state, sim.server)
    frozen = sim.server["gce.weight"]
    torch.testing.assert_close(p, (freq[:, None] * frozen).sum(0) / 10)  # eq. 7
    torch.testing.assert_close(g, frozen.mean(0))  # eq. 5


def test_gpfl_pfllib_form_takes_its_conditions_from_the_clients_own_embeddings_before_they_are_replaced():
    sim = sim_for("gpfl-pfllib", executor="sequential")
    own, upload = [], sim.method.upload

    def remember(client, server):  # what each client trained, as it goes to the server (in client order)
        own.append(client["gce.weight"].clone())
        return upload(client, server)

    sim.method.upload = remember
    for i in range(6):  # round 1 trains on zero conditions: PFLlib's set_GCE first runs after round 1's aggregation
        g, p = sim.method._conditions(client(sim, i), sim.server)
        assert not g.any() and not p.any()
    sim.step()
    assert len(own) == 6 and not torch.allclose(own[0], own[1])
    for i in range(6):
        state = client(sim, i)
        torch.testing.assert_close(state["gce.weight"], sim.server["gce.weight"])  # the received embeddings...
        torch.testing.assert_close(state["gpfl.cond_gce"], own[i])  # ...and the conditions from its own trained ones
        g, p = sim.method._conditions(state, sim.server)
        torch.testing.assert_close(g, own[i].mean(0))
        torch.testing.assert_close(p, state["gpfl.alpha"] @ own[i])  # no 1/U in PFLlib


def test_gpfl_pfllib_step_is_pfllibs_client_step_to_rounding():
    """PFLlib's clientgpfl.train, restated with modules as it writes it (nn.Embedding, F.normalize, one-hot
    log-softmax, one torch.norm over the batch, μ as the SGD weight decay of V and C), at a state of round 2 or
    later: the client's own embeddings (the conditions) differ from the received ones (Ĉ). Loss and gradient
    of every trained tensor agree in float64."""
    sim = sim_for("gpfl-pfllib", dtype="float64", hparams={"lam": 0.3, "mu": 0.1})
    m, lam, mu = sim.method, 0.3, 0.1
    gen = torch.Generator().manual_seed(0)
    state = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) if v.is_floating_point() else v
        for k, v in client(sim, 2).items()
    }
    state["gpfl.cond_gce"] = torch.randn(state["gce.weight"].shape, generator=gen, dtype=torch.float64)
    server = {**sim.server, "gce.weight": torch.randn(state["gce.weight"].shape, generator=gen, dtype=torch.float64)}
    x, y = sim.data.train.client(2)
    x, y = sim.data.decode(x[:10]).double(), y[:10]
    trained = [k for k in state if k.startswith(("body.", "head.", "cov.", "gce."))]
    leaves = {k: state[k].clone().requires_grad_(True) for k in trained}

    def valve(prefix, condition):  # Conditional_gamma / Conditional_beta: Linear → ReLU → LayerNorm
        h = F.relu(F.linear(condition, leaves[prefix + "0.weight"], leaves[prefix + "0.bias"]))
        return F.layer_norm(h, h.shape[-1:], leaves[prefix + "2.weight"], leaves[prefix + "2.bias"])

    def cov(feat, condition):
        return F.relu(feat * (valve("cov.gamma.", condition) + 1) + valve("cov.beta.", condition))

    own, alpha = state["gpfl.cond_gce"], state["gpfl.alpha"]
    generic, personal = (own / 10).sum(0), (own * alpha[:, None]).sum(0)  # set_GCE, before the received C overwrites
    feat = m.net.features(leaves, x)
    out = m.net.head(leaves, cov(feat, personal))
    feat_g = cov(feat, generic)
    cosine = F.linear(F.normalize(feat_g), F.normalize(leaves["gce.weight"]))  # GCE.forward
    one_hot = torch.zeros_like(cosine).scatter_(1, y.view(-1, 1), 1)
    softmax_loss = -torch.mean(torch.sum(one_hot * F.log_softmax(cosine, dim=1), dim=1))
    loss = F.cross_entropy(out, y) + softmax_loss + torch.norm(feat_g - server["gce.weight"][y], 2) * lam
    decay = mu / 2 * sum((leaves[k] ** 2).sum() for k in trained if k.startswith(("cov.", "gce.")))  # weight_decay=μ
    theirs = torch.autograd.grad(loss + decay, list(leaves.values()))
    ours_leaves = {k: state[k].clone().requires_grad_(True) for k in trained}
    ours_loss = m.loss({**state, **ours_leaves}, server, x, y)
    ours = torch.autograd.grad(ours_loss, list(ours_leaves.values()))
    torch.testing.assert_close(ours_loss, loss + decay, rtol=1e-12, atol=1e-12)
    for k, a, b in zip(trained, ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=k)


def test_gpfl_angle_loss_is_cross_entropy_over_cosines():
    sim = sim_for("gpfl", 1, hparams={"mlg": False, "mu": 0.0})
    m, state = sim.method, client(sim, 1)
    x, y = sim.data.train.client(1)
    x = sim.data.decode(x[:20])
    y = y[:20]
    f_global, f_personal = m._routes(state, sim.server, x)
    emb = state["gce.weight"]
    cosine = (f_global / f_global.norm(dim=1, keepdim=True)) @ (emb / emb.norm(dim=1, keepdim=True)).T
    expected = F.cross_entropy(m.net.head(state, f_personal), y) + F.cross_entropy(cosine, y)
    torch.testing.assert_close(m.loss(state, sim.server, x, y), expected)


def test_gpfl_never_uploads_the_head():
    sim = sim_for("gpfl")
    up = sim.method.upload(client(sim, 0), sim.server)
    assert up and not any(k.startswith("head.") for k in up)
    assert {k.split(".")[0] for k in up} == {"body", "cov", "gce"}
    sim.step()
    heads = sim.clients["head.weight"]
    assert not torch.equal(heads[0], heads[1])  # heads stay personal


def test_gpfl_ablations_change_the_loss():
    sim = sim_for("gpfl", 1)
    x, y = sim.data.train.client(0)
    x, y = sim.data.decode(x[:20]), y[:20]
    state = client(sim, 0)
    losses = {}
    for name in ("gpfl", "gpfl-nopci", "gpfl-nocov", "gpfl-nomlg", "gpfl-nogce"):
        m = METHODS[name](sim.method.net, sim.method.training)
        m.valve, m.embeddings, m.constants = sim.method.valve, sim.method.embeddings, sim.method.constants
        losses[name] = m.loss(state, sim.server, x, y).item()
    assert len(set(round(v, 6) for v in losses.values())) == 5


# ------------------------------------------------------------------ FedCP


def test_fedcp_policy_sums_to_one_elementwise():
    sim = sim_for("fedcp", 1)
    m, state = sim.method, client(sim, 2)
    x, _ = sim.data.train.client(2)
    h = m.net.features(state, sim.data.decode(x[:16]))
    r, s = m._policy(state, h)
    assert r.shape == h.shape and (r > 0).all() and (s > 0).all()
    torch.testing.assert_close(r + s, torch.ones_like(r))


def test_fedcp_global_head_is_frozen_and_upload_head_is_the_mean():
    sim = sim_for("fedcp")
    ids = [0, 1, 2]
    cohort = {k: v[ids].clone() for k, v in sim.clients.items()}
    server_before = {k: v.clone() for k, v in sim.server.items()}
    at = sim.at(1, ids)
    cohort = sim._local_hook(sim.method.begin_local, "begin_local", False, cohort, at)
    sim.executor.train(sim.method.phases(), cohort, sim.server, at, 0)
    assert all(torch.equal(server_before[k], sim.server[k]) for k in sim.server)  # W^hd, W^fe untouched
    assert not torch.equal(cohort["head.weight"][0], sim.server["head.weight"])  # the personal head learned
    state = {k: v[0] for k, v in cohort.items()}
    up = sim.method.upload(state, sim.server)
    torch.testing.assert_close(up["head.weight"], (sim.server["head.weight"] + state["head.weight"]) / 2)  # eq. 6
    torch.testing.assert_close(state["fedcp.v"], sim.clients["head.weight"][0].sum(0))  # v_i from before training


def test_fedcp_gumbel_form_runs_vectorized_and_resumes_exactly():
    straight = sim_for("fedcp-gumbel", 2)
    half = sim_for("fedcp-gumbel", 1)
    saved = half.state_dict()
    resumed = sim_for("fedcp-gumbel")
    torch.manual_seed(123)  # whatever happened in between, the saved generator state wins
    resumed.load_state_dict(saved)
    resumed.step()
    for k in straight.clients:
        assert torch.equal(straight.clients[k], resumed.clients[k]), k


def test_fedcp_refuses_cpn_without_global_head():
    from tuner.errors import UserError

    with pytest.raises(UserError, match="cannot keep the CPN"):
        RunConfig(method="fedcp", dataset="digits", hparams={"gh": False}).resolved()


# ------------------------------------------------------------------ FedPAC


def paper_objective(alpha, i, h, v, n):
    """R_i(α) of (46) written out: Σ α_j² V_j / n_j + Σ_jj' α_j α_j' tr Σ_y (h_i − h_j)(h_i − h_j')^T."""
    diff = h[i][None] - h  # (m, C*K)
    return float((alpha**2 * v / n).sum() + alpha @ (diff @ diff.T) @ alpha)


def test_fedpac_qp_matches_brute_force_over_the_simplex():
    torch.manual_seed(0)
    sim = sim_for("fedpac", clients=3)
    h = torch.randn(3, 10, sim.method.net.feature_dim) * 0.3
    h[1] = h[0] + 0.05 * torch.randn_like(h[0])  # clients 0 and 1 alike
    uploads = {"pac.h": h, "pac.v": torch.tensor([4.0, 6.0, 5.0])}
    n = torch.tensor([60.0, 80.0, 40.0])
    alpha = sim.method.combination_weights(uploads, n).double().numpy()
    flat, v, nn_ = h.flatten(1).double().numpy(), uploads["pac.v"].double().numpy(), n.double().numpy()
    grid = [
        np.array([a, b, 1 - a - b])
        for a, b in itertools.product(np.linspace(0, 1, 201), repeat=2)
        if a + b <= 1 + 1e-12
    ]
    for i in range(3):
        best = min(grid, key=lambda g: paper_objective(g, i, flat, v, nn_))
        assert paper_objective(alpha[i], i, flat, v, nn_) <= paper_objective(best, i, flat, v, nn_) + 1e-6
        np.testing.assert_allclose(alpha[i], best, atol=0.01)


def test_fedpac_clients_weight_their_own_group():
    torch.manual_seed(1)
    m, groups = 12, 3
    sim = sim_for("fedpac", clients=m, partition="iid")
    centers = torch.randn(groups, 10, sim.method.net.feature_dim)
    h = torch.stack([centers[i % groups] + 0.05 * torch.randn_like(centers[0]) for i in range(m)])
    alpha = sim.method.combination_weights({"pac.h": h, "pac.v": torch.full((m,), 20.0)}, torch.full((m,), 100.0))
    own = torch.tensor([[float(i % groups == j % groups) for j in range(m)] for i in range(m)])
    assert ((alpha * own).sum(1) > 0.95).all()
    assert torch.allclose(alpha.sum(1), torch.ones(m), atol=1e-5)


def test_fedpac_global_centroids_are_count_weighted():
    sim = sim_for("fedpac", clients=2, partition="iid", hparams={"combine": "none"})
    k = sim.method.net.feature_dim
    counts = torch.zeros(2, 10)
    counts[0, 3], counts[1, 3], counts[1, 4] = 30, 10, 5
    sums = torch.zeros(2, 10, k)
    sums[0, 3], sums[1, 3], sums[1, 4] = 30 * 1.0, 10 * 5.0, 5 * 2.0  # client centroids 1, 5 and 2
    uploads = {key: torch.stack([v, v]) for key, v in sim.server.items() if key.startswith("body.")}
    uploads |= {"pac.count": counts, "pac.sum": sums}
    out = sim.method.aggregate(sim.server, uploads, sim.at(1, [0, 1]))
    torch.testing.assert_close(out["pac.centroids"][3], torch.full((k,), (30 * 1.0 + 10 * 5.0) / 40))  # eq. 19
    torch.testing.assert_close(out["pac.centroids"][4], torch.full((k,), 2.0))
    assert out["pac.has_centroids"] == 1


def test_fedpac_protoweights_prefer_clients_whose_prototypes_fit():
    sim = sim_for("fedpac-protoweights", clients=3, partition="iid")
    k = sim.method.net.feature_dim
    w = torch.zeros(3, 10, k)
    w[:, :, :10] = 5 * torch.eye(10)  # every head reads class c from feature c
    protos = torch.zeros(3, 10, k)
    protos[:2, :, :10] = torch.eye(10)
    protos[2, :, :10] = torch.eye(10).roll(1, dims=0)  # client 2's prototypes sit where other classes belong
    uploads = {"head.weight": w, "head.bias": torch.zeros(3, 10), "pac.sum": protos, "pac.count": torch.ones(3, 10)}
    alpha = sim.method.prototype_weights(uploads)
    torch.testing.assert_close(alpha.sum(1), torch.ones(3))
    assert (alpha[:, 2] < 0.01).all() and torch.allclose(alpha[:, 0], alpha[:, 1])  # eq. 13: softmax of −loss


def test_fedpac_uses_its_papers_training_schedule():
    sim = sim_for("fedpac")
    head, body = sim.method.phases()
    assert head.trains == ("head.",) and head.epochs == 1 and head.optimizer.lr == 0.1
    assert body.trains == ("body.",) and body.epochs == 5 and body.optimizer == SGD(0.05, 0.5, 5e-4)
    assert sim.method.training.batch_size == 50


def test_qp_server_step_is_fast_enough_to_time():
    qp = SimplexQPs(20)
    rng = np.random.default_rng(0)
    h = rng.normal(size=(20, 50))
    alpha = qp.solve(h @ h.T + np.eye(20), h @ h.T)
    assert np.allclose(alpha.sum(1), 1) and (alpha >= 0).all()


# ------------------------------------------------------------------ every method learns


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gpfl", "fedcp", "fedpac", "fedpac-protoweights"])
def test_method_learns_on_digits(method):
    sim = sim_for(method, 4, clients=5)
    assert sim.history[-1]["best_acc"] > 0.6  # chance is 0.1


def test_the_contracts_ten_line_method_runs_as_its_docstring_shows():
    """algorithms/base.py's docstring defines a method, runs its loss and shows a declaration refused: as doctests."""
    import doctest

    import algorithms.base

    result = doctest.testmod(algorithms.base, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10 and result.failed == 0
