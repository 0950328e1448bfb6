"""GPFL (Zhang et al., ICCV 2023): its equations and the PFLlib form's equalities with the reference code's steps."""

import torch
import torch.nn.functional as F
from simulations import client, sim_for

from algorithms import METHODS


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
