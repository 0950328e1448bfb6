"""FedPAC (Xu et al., ICLR 2023): the combination QP against brute force, the centroids and the training schedule."""

import itertools

import numpy as np
import torch
from simulations import sim_for

from algorithms.fedpac import SimplexQPs
from algorithms.optimizers import SGD


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
