"""Methods of PFLlib's roster beyond the papers' tables: each test fails if the method's defining term is removed."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from simulations import batch, client, sim_for
from torch.func import grad

from algorithms import METHODS, ROSTER


def test_fedntd_distills_the_received_models_not_true_classes_only():
    sim = sim_for("fedntd", 1, dtype="float64", hparams={"tau": 3.0})  # τ ≠ 1: the τ² of both references shows
    m, state = sim.method, client(sim, 0)
    x, y = batch(sim, 0)
    state = {
        **state,
        **{k: v + 0.1 * torch.randn_like(v) for k, v in state.items() if k in sim.server},
    }  # local ≠ global
    local, received = m.net.logits(state, x), m.net.logits({**state, **sim.server}, x)
    others = torch.stack(
        [torch.cat([row[:c], row[c + 1 :]]) for row, c in zip(torch.arange(10).repeat(len(y), 1), y, strict=True)]
    )
    gather = lambda z: torch.gather(z, 1, others)  # noqa: E731  the authors' refine_as_not_true
    tau, beta = m.hp.tau, m.hp.beta
    kl = F.kl_div(F.log_softmax(gather(local) / tau, 1), F.softmax(gather(received) / tau, 1), reduction="batchmean")
    # criterion.py's (τ ** 2) * KLDiv
    torch.testing.assert_close(m.loss(state, sim.server, x, y), F.cross_entropy(local, y) + beta * tau**2 * kl)
    assert kl > 1e-4
    # the label's own logit is left to the cross-entropy: the distillation gives it no gradient
    from algorithms.fedntd import not_true_kl

    g = grad(lambda z: not_true_kl(z, received, y, tau))(local)
    assert torch.all(g.gather(1, y[:, None]) == 0) and torch.isfinite(g).all()


@pytest.mark.parametrize("method", ["fedntd", "moon"])
def test_a_frozen_models_forward_leaves_the_clients_batch_norm_statistics_to_its_local_model(method):
    """FedNTD's received model runs in eval mode (its references' `.eval()`); MOON's global model normalizes with
    the batch's statistics, as PFLlib's in train mode, on a copy of the client's: neither moves the client's."""
    sim = sim_for(method, 1, dtype="float64", backbone="tiny_batchnorm")
    m, state = sim.method, client(sim, 0)
    x, y = batch(sim, 0, 20)
    m.net.module.train()  # as in a training step
    alone, step = ({k: v.clone() for k, v in state.items()} for _ in range(2))
    m.net.logits(alone, x)  # the local model's forward: the statistics move once
    m.loss(step, sim.server, x, y)
    for k in m.net.buffer_keys:  # the frozen models' forwards moved them no further
        torch.testing.assert_close(step[k], alone[k])
    if method == "fedntd":
        m.net.module.eval()
        # eval mode: running statistics
        torch.testing.assert_close(m.net.predict({**state, **sim.server}, x), m.net.logits({**state, **sim.server}, x))


def test_feddyn_corrects_each_client_by_its_last_gradient_and_the_server_by_h():
    sim = sim_for("feddyn", 0, join_ratio="0.5", dtype="float64")
    m, keys, alpha = sim.method, sim.method.net.param_keys, sim.method.hp.alpha
    before = {k: sim.server[k].clone() for k in keys}
    sim.step()
    trained = [i for i in range(6) if sim.clients["dyn.grad." + keys[0]][i].abs().sum() > 0]
    assert len(trained) == 3  # the cohort: the rest keep g_k = 0
    cohort = torch.tensor(trained)
    for k in keys:  # the uploads are gone after the broadcast; g_k = −α(θ_k − θ^{t−1}) recovers them
        theta = before[k] - sim.clients["dyn.grad." + k][cohort] / alpha
        h = -alpha * (theta - before[k]).sum(0) / 6
        torch.testing.assert_close(sim.server["dyn.h." + k], h)
        torch.testing.assert_close(sim.server[k], theta.mean(0) - h / alpha)  # plain mean, corrected by h
    # the local objective's gradient: ∇CE − g_k + α(θ − θ^{t−1})
    state, x, y = client(sim, trained[0]), *batch(sim, trained[0])
    params = {k: state[k] + 0.01 for k in keys}
    g = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))(params)
    ce = grad(lambda p: F.cross_entropy(m.net.logits({**state, **p}, x), y))(params)
    for k in keys:
        torch.testing.assert_close(g[k], ce[k] - state["dyn.grad." + k] + alpha * (params[k] - sim.server[k]))


def test_moon_contrasts_with_the_global_and_the_previous_local_model():
    sim = sim_for("moon", 0, join_ratio="1", dtype="float64")
    m, keys = sim.method, sim.method.net.param_keys
    initial = {k: sim.clients[k][0].clone() for k in keys}
    assert all(torch.equal(sim.clients["moon.prev." + k][0], initial[k]) for k in keys)  # at first: the initial model
    sim.step()
    state, x, y = client(sim, 0), *batch(sim, 0)
    # the model it trained, not the global one
    assert not torch.allclose(state["moon.prev." + keys[0]], sim.server[keys[0]])
    state = {**state, **{k: state[k] + 0.05 * torch.randn_like(state[k]) for k in keys}}
    z, zg, zp = (
        m.net.features(s, x)
        for s in (state, {**state, **sim.server}, {**state, **{k: state["moon.prev." + k] for k in keys}})
    )
    sg, sp = F.cosine_similarity(z, zg) / m.hp.tau, F.cosine_similarity(z, zp) / m.hp.tau
    contrastive = -torch.log(sg.exp() / (sg.exp() + sp.exp())).mean()
    torch.testing.assert_close(
        m.loss(state, sim.server, x, y), F.cross_entropy(m.net.head(state, z), y) + m.hp.mu * contrastive
    )


def test_fedbn_keeps_every_batch_norm_layer_local_and_shares_the_rest():
    sim = sim_for("fedbn", 1, join_ratio="1", partition="dir:0.3")
    norms = [k for k in sim.method.net.param_keys if k.startswith(sim.method.local_norms)]
    assert norms == ["body.2.weight", "body.2.bias", "head.0.weight", "head.0.bias"]  # tiny_batchnorm's two BatchNorm1d
    assert not set(norms) & set(sim.server)
    for k in norms:
        assert len({tuple(v.tolist()) for v in sim.clients[k]}) == 6  # each client's own
    shared = [k for k in sim.method.net.param_keys if k not in norms]
    for k in shared:
        assert all(torch.equal(v, sim.server[k]) for v in sim.clients[k])  # the rest: the server's


def test_fedbn_refuses_a_backbone_without_batch_norm():
    from tuner.errors import UserError

    with pytest.raises(UserError, match="backbone=resnet18"):
        sim_for("fedbn", 0, backbone="mlp")


def test_fml_teaches_each_model_by_the_other_and_predicts_with_the_local_one():
    sim = sim_for("fml", 1, dtype="float64")
    m, keys, state = sim.method, sim.method.net.param_keys, client(sim, 0)
    x, y = batch(sim, 0)
    assert not torch.allclose(state[keys[0]], state["meme." + keys[0]])  # two models, not one
    params = {k: state[k] for k in keys} | {"meme." + k: state["meme." + k] for k in keys}
    g = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))(params)
    local, meme = m.net.logits(state, x), m.net.logits(state, x, "meme.")

    def own(prefix, other, a):  # eq. 1 / eq. 2 with the other model's prediction as a constant target
        def f(p):
            z = m.net.logits({**state, **p}, x, prefix)
            return a * F.cross_entropy(z, y) + (1 - a) * F.kl_div(
                F.log_softmax(z, -1), F.softmax(other, -1), reduction="batchmean"
            )

        return grad(f)({prefix + k: state[prefix + k] for k in keys})

    g_local, g_meme = own("", meme, m.hp.alpha), own("meme.", local, m.hp.beta)
    for k in keys:
        torch.testing.assert_close(g[k], g_local[k])
        torch.testing.assert_close(g["meme." + k], g_meme["meme." + k])
    torch.testing.assert_close(m.logits(state, sim.server, x), local)  # the local model predicts


def test_fedlc_calibrates_each_clients_logits_by_its_own_label_counts():
    sim = sim_for("fedlc", 1, dtype="float64", partition="pat:2")
    m, state = sim.method, client(sim, 0)
    _, labels = sim.data.train.client(0)
    counts = torch.bincount(labels, minlength=10).double()
    assert (counts == 0).sum() == 8  # two classes: the other eight get the largest calibration
    torch.testing.assert_close(state["lc.counts"], counts.clamp(min=1e-8))
    x, y = batch(sim, 0)
    logits = m.net.logits(state, x)
    calibrated = F.cross_entropy(logits - m.hp.tau * counts.clamp(min=1e-8) ** -0.25, y)
    torch.testing.assert_close(m.loss(state, sim.server, x, y), calibrated)
    assert abs(calibrated - F.cross_entropy(logits, y)) > 1e-3


def test_fedlc_pfllib_calibrates_every_client_by_the_federations_label_counts():
    sim = sim_for("fedlc-pfllib", 1, dtype="float64", partition="pat:2")
    m = sim.method
    federation = torch.bincount(sim.data.train.y, minlength=10).double()
    for i in range(6):  # one vector for all, though each client holds two classes
        torch.testing.assert_close(sim.clients["lc.counts"][i], federation)
    state, (x, y) = client(sim, 0), batch(sim, 0)
    logits = m.net.logits(state, x)
    torch.testing.assert_close(
        m.loss(state, sim.server, x, y), F.cross_entropy(logits - m.hp.tau * federation**-0.25, y)
    )


def test_fd_distills_toward_the_cohorts_class_average_logits():
    sim = sim_for("fd", 0, join_ratio="1", dtype="float64", partition="pat:2")
    m = sim.method
    assert not sim.server["fd.has"].any()
    sim.step()
    expected, holders = torch.zeros(10, 10, dtype=torch.float64), torch.zeros(10, dtype=torch.float64)
    for i in range(6):  # each client's class averages of its trained model's logits, then a plain mean over clients
        state = client(sim, i)
        x, y = sim.data.train.client(i)
        out = m.net.logits(state, sim.data.decode(x))
        for c in y.unique():
            expected[c] += out[y == c].mean(0)
            holders[c] += 1
    assert (holders > 0).all() and holders.max() > 1
    torch.testing.assert_close(sim.server["fd.global"], expected / holders[:, None])
    state, (x, y) = client(sim, 0), batch(sim, 0)
    out = m.net.logits(state, x)
    # the global logits' softmax as the soft target
    soft = F.cross_entropy(out, F.softmax(sim.server["fd.global"][y], -1))
    torch.testing.assert_close(m.loss(state, sim.server, x, y), F.cross_entropy(out, y) + m.hp.lam * soft)
    assert soft.abs() > 1e-3
    m.hp = type(m.hp)(lam=m.hp.lam, target="logits")  # PFLlib's: the raw logits, as its CrossEntropyLoss takes them
    raw = F.cross_entropy(out, sim.server["fd.global"][y])
    torch.testing.assert_close(m.loss(state, sim.server, x, y), F.cross_entropy(out, y) + m.hp.lam * raw)
    assert not any(k in sim.server for k in m.net.param_keys)  # no weights leave a client


def test_pflda_pulls_the_personal_head_and_adapts_the_body_to_the_global_head():
    sim = sim_for("pflda", 1, join_ratio="1", dtype="float64")
    m, state, (x, y) = sim.method, client(sim, 0), batch(sim, 0)
    head_keys = m.net.keys(("head.",))
    assert set(sim.server) == {"ghead." + k.removeprefix("head.") for k in head_keys}  # the global head alone is shared
    body = m.net.keys(("body.",))[0]
    assert not torch.allclose(sim.clients[body][0], sim.clients[body][1])  # bodies stay personal
    phase1, phase2 = m.phases()
    assert phase1.trains == ("head.",) and phase2.trains == ("body.", "ghead.")
    gap = torch.cat([(state[k] - state["g" + k]).flatten() for k in head_keys])
    assert gap.norm() > 1e-3
    g = grad(lambda p: phase1.loss({**state, **p}, sim.server, x, y))({k: state[k] for k in head_keys})
    ce = grad(lambda p: F.cross_entropy(m.net.logits({**state, **p}, x), y))({k: state[k] for k in head_keys})
    for k in head_keys:  # the pull's gradient: λ (head − ghead) / ‖head − ghead‖
        torch.testing.assert_close(g[k], ce[k] + m.hp.lam * (state[k] - state["g" + k]) / gap.norm())
    body_out = m.net.head(state, m.net.features(state, x), "ghead.")
    torch.testing.assert_close(phase2.loss(state, sim.server, x, y), F.cross_entropy(body_out, y))
    torch.testing.assert_close(m.logits(state, sim.server, x), m.net.logits(state, x))  # the personal model predicts


def test_fedgh_trains_the_servers_head_on_the_clients_prototypes():
    sim = sim_for("fedgh", 0, join_ratio="1", dtype="float64", partition="pat:2")
    m, head_keys = sim.method, sim.method.net.keys(("head.",))
    before = {k: sim.server[k].clone() for k in head_keys}
    sim.step()
    protos, labels = [], []
    for i in range(6):  # each client's class means of its trained body's features
        state = client(sim, i)
        x, y = sim.data.train.client(i)
        f = m.net.features(state, sim.data.decode(x))
        for c in y.unique():
            protos.append(f[y == c].mean(0))
            labels.append(c)
            torch.testing.assert_close(state["gh.sum"][c] / state["gh.count"][c], protos[-1])
    protos, labels = torch.stack(protos), torch.stack(labels)
    assert len(labels) == 12  # two classes a client
    from algorithms.common import uniform

    order = torch.argsort(uniform(torch.tensor(1), (12,), torch.float64))  # the keyed order: seed 0, round 1
    head = {k: v.clone().requires_grad_(True) for k, v in before.items()}
    opt = torch.optim.SGD(head.values(), lr=m.hp.server_lr)
    for start in range(0, 12, m.training.batch_size):  # one epoch over the pairs, the run's batch size
        idx = order[start : start + m.training.batch_size]
        opt.zero_grad()
        F.cross_entropy(m.net.head(head, protos[idx]), labels[idx]).backward()
        opt.step()
    for k in head_keys:
        torch.testing.assert_close(sim.server[k], head[k].detach())
        assert not torch.allclose(sim.server[k], before[k])
        # every client predicts with the server's head
        assert all(torch.equal(v, sim.server[k]) for v in sim.clients[k])
    body = m.net.keys(("body.",))[0]
    # bodies stay personal
    assert body not in sim.server and not torch.allclose(sim.clients[body][0], sim.clients[body][1])
    assert set(m.upload(client(sim, 0), sim.server)) == {"gh.sum", "gh.count"}  # no weights uploaded


def test_fedcac_mixes_each_clients_critical_parameters_from_its_collaborators_only():
    sim = sim_for("fedcac", 0, join_ratio="1", dtype="float64", partition="pat:2", hparams={"beta": 3})
    keys, tau = sim.method.net.param_keys, 0.5
    start = {k: sim.clients[k].clone() for k in keys}
    sim.step()
    # the broadcast mixes the trained models away: the same round again, its broadcast left out, keeps them
    again = sim_for("fedcac", 0, join_ratio="1", dtype="float64", partition="pat:2", hparams={"beta": 3})
    # keep the trained models where the broadcast would mix them
    again.method.broadcast = lambda client, server, at: client
    again.step()
    trained = {k: again.clients[k].clone() for k in keys}
    masks = []
    for i in range(6):
        flat = []
        for k in keys:
            c = ((trained[k][i] - start[k][i]) * trained[k][i]).abs().flatten()
            top = torch.topk(c, int(tau * c.numel())).values[-1]  # PFLlib's evaluate_critical_parameter
            mask = (c >= top).double()
            torch.testing.assert_close(sim.clients["cac.mask." + k][i].flatten(), mask)
            flat.append(mask)
        masks.append(torch.cat(flat))
    overlap = [[1 - (masks[i] - masks[j]).abs().sum() / (2 * masks[i].sum()) for j in range(6)] for i in range(6)]
    pairs = torch.stack([overlap[i][j] for i in range(6) for j in range(6) if i != j])
    threshold = pairs.mean() + 1 / 3 * (pairs.max() - pairs.mean())  # round 1, β = 3
    n = sim.data.train.counts
    for k in keys:
        glob = sum(n[i] * trained[k][i] for i in range(6)) / sum(n)
        torch.testing.assert_close(sim.server[k], glob)
        for i in range(6):
            team = [i] + [j for j in range(6) if j != i and overlap[i][j] >= threshold]
            custom = sum(trained[k][j] for j in team) / len(team)
            torch.testing.assert_close(sim.server["cac.custom." + k][i], custom)
            mask = sim.clients["cac.mask." + k][i]
            torch.testing.assert_close(sim.clients[k][i], mask * custom + (1 - mask) * glob)  # the broadcast's mix
    sizes = [sum(1 for j in range(6) if j != i and overlap[i][j] >= threshold) for i in range(6)]
    assert 0 < sum(sizes) < 30  # some collaborate, not everyone with everyone


def test_fedcac_pfllib_sends_each_clients_critical_parameters_back_to_the_initial_model_after_round_1():
    """PFLlib's server customizes nothing at its first round, so a client's critical parameters take its customized
    model as built, the initial model; from round 2 on it customizes as FedCAC (and Fling) do."""
    pfllib = sim_for("fedcac-pfllib", 0, join_ratio="1", dtype="float64", partition="pat:2", hparams={"beta": 3})
    fling = sim_for("fedcac", 0, join_ratio="1", dtype="float64", partition="pat:2", hparams={"beta": 3})
    keys, initial = pfllib.method.net.param_keys, {k: pfllib.clients[k].clone() for k in pfllib.method.net.param_keys}
    pfllib.step()
    fling.step()
    for k in keys:
        mask = pfllib.clients["cac.mask." + k]
        # the same training, the same masks
        torch.testing.assert_close(pfllib.clients["cac.mask." + k], fling.clients["cac.mask." + k])
        torch.testing.assert_close(pfllib.clients[k], mask * initial[k] + (1 - mask) * pfllib.server[k])
        assert not torch.allclose(pfllib.clients[k], fling.clients[k])
    pfllib.step()
    assert not torch.allclose(pfllib.server["cac.custom." + keys[0]], initial[keys[0]])  # round 2 customizes


def test_fedpcl_contrasts_features_with_global_and_every_clients_prototypes():
    sim = sim_for("fedpcl", 0, join_ratio="1", dtype="float64", partition="pat:2")
    m, body = sim.method, sim.method.net.keys(("body.",))
    before = {k: sim.clients[k].clone() for k in body}
    sim.step()  # no prototypes yet: round 1 trains nothing, and only collects them
    assert all(torch.equal(sim.clients[k], before[k]) for k in body)
    local, holds = torch.zeros(6, 10, m.net.feature_dim, dtype=torch.float64), torch.zeros(6, 10, dtype=torch.bool)
    for i in range(6):
        x, y = sim.data.train.client(i)
        z = F.normalize(m.net.features(client(sim, i), sim.data.decode(x)), dim=1)
        for c in y.unique():
            local[i, c], holds[i, c] = z[y == c].mean(0), True
    glob = (local * holds[..., None]).sum(0) / holds.sum(0)[:, None]
    torch.testing.assert_close(sim.server["pcl.global"], glob)
    padded = torch.where(holds[..., None], local, glob)  # a class a client lacks: the global prototype
    torch.testing.assert_close(sim.server["pcl.clients"], padded)
    state, (x, y) = client(sim, 0), batch(sim, 0)
    z = F.normalize(m.net.features(state, x), dim=1)
    tau = m.hp.tau
    expected = (
        F.cross_entropy(z @ glob.T / tau, y) + sum(F.cross_entropy(z @ padded[j].T / tau, y) for j in range(6)) / 6
    )
    torch.testing.assert_close(m.loss(state, sim.server, x, y), expected)
    # its own prototypes predict
    assert m.logits(state, sim.server, x).argmax(1).tolist() == (z @ padded[0].T).argmax(1).tolist()
    (phase,) = m.phases()
    assert phase.clip == 10.0 and phase.trains == ("body.",)


def test_a_phase_clips_each_clients_gradient_as_clip_grad_norm():
    sim = sim_for("fedpcl", 1, dtype="float64")
    m, state, (x, y) = sim.method, client(sim, 0), batch(sim, 0)
    (phase,) = m.phases()
    params = {k: state[k] for k in m.net.keys(("body.",))}
    rest = {k: v for k, v in state.items() if k not in params}
    clipped, _ = sim.executor._step_loss(phase)(params, rest, sim.server, x, y)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    m.loss({**rest, **leaves}, sim.server, x, y).backward()
    raw = torch.sqrt(sum((v.grad**2).sum() for v in leaves.values()))
    torch.nn.utils.clip_grad_norm_(list(leaves.values()), 10.0)
    for k in params:  # torch's own clip_grad_norm_ (at 10: whichever side of it this gradient falls)
        torch.testing.assert_close(clipped[k], leaves[k].grad)
    from dataclasses import replace

    tight, _ = sim.executor._step_loss(replace(phase, clip=float(raw) / 4))(params, rest, sim.server, x, y)
    # a norm over the limit is cut to it
    assert torch.sqrt(sum((v**2).sum() for v in tight.values())) == pytest.approx(float(raw) / 4, rel=1e-6)


def test_fedmtl_ties_each_model_to_the_others_through_the_relationship_regularizer():
    sim = sim_for("fedmtl", 1, join_ratio="0.5", dtype="float64", hparams={"lam": 0.01})
    m, keys = sim.method, sim.method.net.param_keys
    for k in keys:  # the server keeps every client's latest model; each client gets the sum of the others'
        torch.testing.assert_close(sim.server["mtl.models." + k], sim.clients[k])
        for i in range(6):
            torch.testing.assert_close(sim.clients["mtl.others." + k][i], sim.clients[k].sum(0) - sim.clients[k][i])
    state, (x, y) = client(sim, 0), batch(sim, 0)
    params = {k: state[k] for k in keys}
    g = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))(params)
    ce = grad(lambda p: F.cross_entropy(m.net.logits({**state, **p}, x), y))(params)
    omega = 1 - 1 / 6
    for k in keys:  # λ ∂(‖w_i‖² + ω²‖w_i + S_i‖²)
        torch.testing.assert_close(
            g[k], ce[k] + 0.01 * (2 * state[k] + 2 * omega**2 * (state[k] + state["mtl.others." + k]))
        )
    size = sum(v.numel() for v in m.net.initial_state().values())
    assert m.pfllib_scale == 10.0 ** -(len(str(size)) + 1)  # PFLlib's default weight, 10^-(digits of D + 1)


def test_fedgen_trains_the_generator_on_the_uploaded_heads_and_distils_it_into_the_clients():
    from algorithms.common import DRAW_KEY

    sim = sim_for("fedgen", 0, join_ratio="1", dtype="float64", partition="pat:2", hparams={"server_epochs": 4})
    m, keys = sim.method, sim.method.net.param_keys
    counts = torch.bincount(sim.data.train.y, minlength=10).double()
    gen0 = {k: v.clone() for k, v in sim.server.items() if k.startswith("gen.")}
    state, (x, y) = client(sim, 0), batch(sim, 0)
    key = torch.tensor(12345)
    z, labels = m.generate(sim.server, key, 4000)
    freq = torch.bincount(labels, minlength=10).double() / 4000
    assert (freq - counts / counts.sum()).abs().max() < 0.03  # ỹ by the federation's label frequencies
    z, labels = m.generate(sim.server, key, m.training.batch_size)
    expected = F.cross_entropy(m.net.logits(state, x), y) + F.cross_entropy(m.net.head(state, z), labels)
    torch.testing.assert_close(m.loss({**state, DRAW_KEY: key}, sim.server, x, y), expected)
    # the server: Adam (torch's, bias-corrected) on CE of the weighted ensemble of the uploaded heads, then FedAvg
    seen = []
    aggregate = m.aggregate
    m.aggregate = lambda server, up, at: (
        seen.append({k: v.clone() for k, v in up.items()}),
        aggregate(server, up, at),
    )[1]
    sim.step()
    uploads = [{k: v[i] for k, v in seen[0].items()} for i in range(6)]
    n = torch.tensor(sim.data.train.counts, dtype=torch.float64)
    w = n / n.sum()
    gen = {k: v.clone().requires_grad_(True) for k, v in gen0.items()}
    adam = torch.optim.Adam(gen.values(), lr=m.hp.generator_lr)
    for t in range(4):
        # seed 0, round 1, step t
        zt, lt = m.generate(gen, torch.tensor((1 * 10_007 + t) % 2**32), m.training.batch_size)
        logits = sum(w[i] * m.net.head({k: uploads[i][k] for k in keys if k.startswith("head.")}, zt) for i in range(6))
        adam.zero_grad()
        F.cross_entropy(logits, lt).backward()
        adam.step()
    for k in gen:
        torch.testing.assert_close(sim.server[k], gen[k].detach())
    # (fc1's bias has no gradient: batch norm follows it)
    assert not torch.allclose(sim.server["gen.fc.weight"], gen0["gen.fc.weight"])
    for k in keys:
        torch.testing.assert_close(sim.server[k], sum(w[i] * uploads[i][k] for i in range(6)))


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_feddbe_carries_the_running_mean_of_features_from_step_to_step(executor):
    # lr 1e-200: the model stays where it is (float64 cannot hold such a step), so each step's batch mean is known from
    # the batch schedule
    from tuner.draws import batch_schedule

    sim = sim_for("feddbe", 0, join_ratio="1", dtype="float64", lr=1e-200, executor=executor, hparams={"rho": 0.3})
    m, rho = sim.method, 0.3
    sim.step()
    n = torch.tensor(sim.data.train.counts, dtype=torch.float64)
    runnings = []
    for i in range(6):
        x, _ = sim.data.train.client(i)
        f = m.net.features(client(sim, i), sim.data.decode(x))
        running = torch.zeros(m.net.feature_dim, dtype=torch.float64)
        for rows in batch_schedule(0, 1, 0, i, len(x), m.training.batch_size, 1):  # seed 0, round 1, phase 0
            running = (1 - rho) * running + rho * f[rows].mean(0)
        torch.testing.assert_close(sim.clients["dbe.running"][i], running)
        runnings.append(running)
    global_mean = sum(w * r for w, r in zip(n / n.sum(), runnings, strict=True))
    torch.testing.assert_close(sim.server["dbe.global_mean"], global_mean)  # m_g: round 1's running means, weighted
    assert sim.server["dbe.ready"] == 1


def test_feddbe_adds_its_bias_and_pulls_the_running_mean_to_the_global_one():
    sim = sim_for("feddbe", 2, join_ratio="1", dtype="float64", hparams={"rho": 0.5})
    m, state, (x, y) = sim.method, {k: v.clone() for k, v in client(sim, 0).items()}, batch(sim, 0)
    assert state["dbe.bias"].abs().sum() > 0  # trained from round 2
    before = state["dbe.running"].clone()
    f = m.net.features(state, x)
    running = 0.5 * before + 0.5 * f.mean(0)
    expected = (
        F.cross_entropy(m.net.head(state, f + state["dbe.bias"]), y)
        + 50.0 * (0.5 * (running - sim.server["dbe.global_mean"]) ** 2).mean()
    )
    torch.testing.assert_close(m.loss(state, sim.server, x, y), expected)
    torch.testing.assert_close(state["dbe.running"], running)  # the step's forward wrote it
    torch.testing.assert_close(m.logits(state, sim.server, x), m.net.head(state, f + state["dbe.bias"]))


def _pfllib_decomposition(w, energy):
    """PFLlib's decomposition (clientkd.py), restated in numpy: the weight as it arrives after np.linalg.svd
    and the cut."""
    import numpy as np

    w = w.numpy()
    if not (w.shape[0] > 1 and w.ndim > 1):
        return w
    u, s, v = np.linalg.svd(w, full_matrices=False)
    if u.ndim == 4:
        u, s, v = np.transpose(u, (2, 3, 0, 1)), np.transpose(s, (2, 0, 1)), np.transpose(v, (2, 3, 0, 1))
    if np.sum(np.square(s)) == 0:
        return w
    rank = 0
    for n in range(len(s)):
        if np.sum(np.square(s[:n])) > energy * np.sum(np.square(s)):
            rank = n
            break
    u, s, v = u[:, :rank], s[:rank], v[:rank, :]
    if u.ndim == 4:
        u, s, v = np.transpose(u, (2, 3, 0, 1)), np.transpose(s, (1, 2, 0)), np.transpose(v, (2, 3, 0, 1))
    return np.matmul(u * s[..., None, :], v)


def test_fedkd_cuts_each_weight_to_the_singular_values_holding_its_energy_as_pfllib():
    from algorithms.fedkd import truncated

    gen = torch.Generator().manual_seed(0)
    low = torch.randn(40, 3, generator=gen, dtype=torch.float64) @ torch.randn(
        3, 30, generator=gen, dtype=torch.float64
    )
    cases = [
        torch.randn(40, 30, generator=gen, dtype=torch.float64),
        low + 0.01 * torch.randn(40, 30, generator=gen, dtype=torch.float64),
        torch.randn(8, 4, 5, 5, generator=gen, dtype=torch.float64),
        torch.randn(30, generator=gen, dtype=torch.float64),
        torch.randn(1, 30, generator=gen, dtype=torch.float64),
        torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64)),
    ]
    for w in cases:
        for energy in (0.5, 0.95, 0.98):
            torch.testing.assert_close(truncated(w, energy), torch.from_numpy(_pfllib_decomposition(w, energy)))
    # a rank-3 matrix with noise: three values hold 95 %
    assert torch.linalg.matrix_rank(truncated(cases[1], 0.95)) == 3
    # equal values: the share is passed only by the last, and nothing is kept (as PFLlib)
    assert not truncated(cases[5], 0.98).any()


def test_fedkd_distils_teacher_and_student_into_each_other_and_uploads_the_cut_student():
    sim = sim_for("fedkd", 1, join_ratio="1", dtype="float64")
    m, state, (x, y) = sim.method, client(sim, 0), batch(sim, 0)
    state = {
        **state,
        **{k: v + 0.05 * torch.randn_like(v) for k, v in state.items() if k.startswith(("body.", "head."))},
    }
    f_t, f_s = m.net.features(state, x), m.net.features(state, x, "global.body.")
    z_t, z_s = m.net.head(state, f_t), m.net.head(state, f_s, "global.head.")
    ce_t, ce_s = F.cross_entropy(z_t, y), F.cross_entropy(z_s, y)
    kl = lambda a, b: F.kl_div(a, b, reduction="sum") / a.numel()  # noqa: E731  PFLlib's KLDivLoss(): its default "mean", over every element
    mse = torch.nn.MSELoss()
    w_h = lambda f: f @ state["kd.W"].T  # noqa: E731
    teacher = ce_t + kl(F.log_softmax(z_t, 1), F.softmax(z_s, 1)) / (ce_t + ce_s) + mse(f_t, w_h(f_s)) / (ce_t + ce_s)
    student = ce_s + kl(F.log_softmax(z_s, 1), F.softmax(z_t, 1)) / (ce_t + ce_s) + mse(f_t, w_h(f_s)) / (ce_t + ce_s)
    # both backward passes reach every model
    torch.testing.assert_close(m.loss(state, sim.server, x, y), teacher + student)
    (phase,) = m.phases()
    assert phase.clip == 10.0 and phase.clip_groups == (("body.", "head."), ("global.",), ("kd.W",))
    energy = sim.server["kd.energy"]
    assert float(energy) == pytest.approx(0.95 + 1 / 5 * 0.03)  # the next round's share (5 rounds)
    up = m.upload(state, sim.server)
    from algorithms.fedkd import truncated

    for k, v in up.items():
        torch.testing.assert_close(v, truncated(state[k], energy))
    weight = "global." + m.net.keys(("body.",))[0]
    assert torch.linalg.matrix_rank(up[weight]) < min(up[weight].shape)  # cut
    assert torch.allclose(m.logits(state, sim.server, x), z_t)  # the teacher predicts


def test_fedgc_corrects_the_heads_of_clients_without_a_class_away_from_its_embedding():
    sim = sim_for("fedgc", 0, join_ratio="1", dtype="float64", partition="pat:2")
    m = sim.method
    seen = []
    aggregate = m.aggregate
    m.aggregate = lambda server, up, at: (
        seen.append({k: v.clone() for k, v in up.items()}),
        aggregate(server, up, at),
    )[1]
    sim.step()
    up = seen[0]
    holds = up["gc.holds"]
    for i in range(6):
        _, y = sim.data.train.client(i)
        assert holds[i].nonzero().flatten().tolist() == y.unique().tolist()
    # PFLlib's reg_train, restated with its loops and exponentials
    heads = up["gc.head"].clone().requires_grad_(True)
    centres = {
        c: torch.stack([up["gc.head"][i, c] for i in range(6) if holds[i, c]]).mean(0)
        for c in range(10)
        if holds[:, c].any()
    }
    reg = 0
    for i in range(6):
        for c in holds[i].nonzero().flatten().tolist():
            d1 = torch.exp(centres[c] @ centres[c])
            d2 = sum(torch.exp(heads[j][holds[j] > 0] @ centres[c]).sum() for j in range(6) if not holds[j, c])
            reg = reg - torch.log(d1 / (d1 + d2))
    reg.backward()
    expected = up["gc.head"] - m.training.lr * m.hp.lam * heads.grad
    torch.testing.assert_close(sim.server["gc.heads"], expected)
    assert (heads.grad.abs().sum((1, 2)) > 0).all()
    for i in range(6):
        torch.testing.assert_close(sim.clients["gc.head"][i], expected[i])  # each client takes its corrected head back
    state, (x, y) = client(sim, 0), batch(sim, 0)
    logits = m.logits(state, sim.server, x)
    assert set(logits.argmax(1).tolist()) <= set(holds[0].nonzero().flatten().tolist())  # its own classes only
    own = holds[0].nonzero().flatten()  # PFLlib's head of the client's classes, labels as positions among them
    restricted = m.net.features(state, x) @ state["gc.head"][own].T
    torch.testing.assert_close(m.loss(state, sim.server, x, y), F.cross_entropy(restricted, torch.searchsorted(own, y)))


def pfllib_similarity(a: dict, b: dict, entries: list[str]) -> torch.Tensor:
    """PFLlib servercross.py's calculate_similarity for two state dicts, its loop as written."""
    s, cnt = 0.0, 0
    for p in entries:
        x, z = a[p].reshape(-1).double(), b[p].reshape(-1).double()
        if cnt % 2 == 0:
            sub_a, sub_b = x, z
        else:
            sub_a, sub_b = torch.cat((sub_a, x)), torch.cat((sub_b, z))
        if cnt % 2 == 1:
            s += F.cosine_similarity(sub_a, sub_b, dim=0)
        cnt += 1
    return s + F.cosine_similarity(sub_a, sub_b, dim=0)


def odd_backbone(input_shape, num_classes):
    """Three state_dict entries: PFLlib's similarity counts the last one once."""
    from torch import nn

    from tuner.models import Backbone

    return Backbone(
        nn.Sequential(nn.Flatten(), nn.Linear(64, 16)), nn.Sequential(nn.Linear(16, num_classes, bias=False)), 16
    )


@pytest.mark.parametrize("backbone", ["mlp", "tiny_batchnorm", "odd"])  # even, with batch-norm statistics, odd
def test_fedcross_trains_middleware_models_and_mixes_each_with_its_least_similar(backbone, monkeypatch):
    from tuner.models import BACKBONES

    monkeypatch.setitem(BACKBONES, "odd", odd_backbone)
    sim = sim_for("fedcross", 0, join_ratio="1", dtype="float64", partition="pat:2", backbone=backbone)
    m, keys = sim.method, sim.method.net.param_keys
    entries = list(m.net.module.state_dict())
    assert len(entries) % 2 == (backbone == "odd")
    statistics = {k: v[0].clone() for k, v in sim.clients.items() if k in m.net.buffer_keys}  # the initial model's
    seen = []
    aggregate = m.aggregate
    m.aggregate = lambda server, up, at: (
        seen.append(({k: v.clone() for k, v in up.items()}, m.positions(at))),
        aggregate(server, up, at),
    )[1]
    sim.step()
    at = sim.at(2, list(range(6)))
    slots = m.positions(at)
    for i in range(6):  # round 2's clients each take the middleware of their place in the shuffle
        took = m.begin_local(client(sim, i), sim.server, {}, at.client(i))
        for k in keys:
            torch.testing.assert_close(took[k], sim.server["cross.m." + k][slots[i]])
    sim.step()  # round 2: the middleware models differ, so who trains which matters
    up, slots = seen[1]
    assert sorted(slots.tolist()) == list(range(6)) and slots.tolist() != list(range(6))  # a shuffle, one model each
    assert seen[0][1].tolist() != slots.tolist()  # drawn anew each round
    for i in range(6):  # each client's model is the middleware it trained
        for k in keys:
            torch.testing.assert_close(sim.clients[k][i], up[k][i])
    # a middleware keeps the initial statistics: PFLlib's clients copy parameters only
    trained = [{**statistics} for _ in range(6)]
    for i in range(6):
        for k in keys:
            trained[slots[i]][k] = up[k][i]
    sim_tab = [
        [pfllib_similarity(trained[a], trained[b], entries) if a != b else 0.0 for b in range(6)] for a in range(6)
    ]
    for j in range(6):
        others = [p for p in range(6) if p != j]
        least = min(others, key=lambda p: sim_tab[j][p])
        for k in keys:
            torch.testing.assert_close(sim.server["cross.m." + k][j], 0.99 * trained[j][k] + 0.01 * trained[least][k])


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_fedala_learns_clipped_element_wise_weights_on_a_share_of_the_data_when_it_receives(executor):
    from tuner.draws import RECEIVE_STREAM, batch_schedule

    sim = sim_for("fedala", 1, join_ratio="1", dtype="float64", executor=executor, hparams={"eta": 20.0})
    m, higher = sim.method, sim.method.higher
    assert higher == m.net.param_keys[-2:]
    for k in m.net.param_keys:
        if k not in higher:  # the lower layers: the global model's
            assert all(torch.equal(v, sim.server[k]) for v in sim.clients[k])
    for i in range(6):
        state = client(sim, i)
        x, y = sim.data.train.client(i)
        w = {k: torch.ones_like(state[k]) for k in higher}  # round 1's weights start at 1
        schedule = batch_schedule(0, 2, RECEIVE_STREAM, i, len(y), m.training.batch_size, 1, take=int(0.8 * len(y)))
        assert (schedule[-1] < 0).any()  # the last batch partial, as the reference's loader (drop_last=False) keeps it
        for rows in schedule:  # the reference's update: W ← clip(W − η ∂L/∂θ_t ⊙ (θ_g − θ), 0, 1)
            rows = rows[rows >= 0]
            leaves = {k: (state[k] + (state["ala.g." + k] - state[k]) * w[k]).requires_grad_(True) for k in higher}
            F.cross_entropy(m.net.logits({**state, **leaves}, sim.data.decode(x[rows])), y[rows]).backward()
            w = {k: (w[k] - 20.0 * leaves[k].grad * (state["ala.g." + k] - state[k])).clamp(0, 1) for k in higher}
        for k in higher:
            torch.testing.assert_close(state["ala.w." + k], w[k])
    learned = torch.cat([sim.clients["ala.w." + k].flatten() for k in higher])
    assert ((learned == 0) | (learned == 1)).any() and ((learned > 0) & (learned < 1)).any()  # clipped, and learned
    state, (x, _) = client(sim, 0), batch(sim, 0)
    mixed = {k: state[k] + (state["ala.g." + k] - state[k]) * state["ala.w." + k] for k in higher}
    # predicts with the aggregate
    torch.testing.assert_close(m.logits(state, sim.server, x), m.net.logits({**state, **mixed}, x))
    started = m.begin_local(state, sim.server, {}, None)
    for k in higher:  # and trains from it
        torch.testing.assert_close(started[k], mixed[k])


def test_fedala_writes_the_blend_into_every_clients_model_whether_it_trains_or_not():
    """PFLlib's server adapts every client on sending (serverala.py `send_models`), so a client outside the
    cohort keeps the blend as its own model and blends the next global model into that."""
    from tuner.draws import sample_cohort

    sim = sim_for("fedala", 1, join_ratio="0.5", dtype="float64")
    higher = sim.method.higher
    idle = next(i for i in range(6) if i not in sample_cohort(0, 2, 6, (0.5, 0.5)))
    before = client(sim, idle)  # after round 1's broadcast and adaptation
    blend = {k: before[k] + (before["ala.g." + k] - before[k]) * before["ala.w." + k] for k in higher}
    sim.step()  # round 2, without it
    for k in higher:
        torch.testing.assert_close(sim.clients[k][idle], blend[k])
        torch.testing.assert_close(sim.clients["ala.g." + k][idle], sim.server[k])


def test_sgd_with_group_learning_rates_is_torchs_sgd_with_parameter_groups():
    from algorithms.optimizers import SGD

    torch.manual_seed(0)
    start = {
        "core.w": torch.randn(3, 4, dtype=torch.float64),
        "core.b": torch.randn(4, dtype=torch.float64),
        "p": torch.randn(5, dtype=torch.float64),
    }
    ours = {k: v.clone() for k, v in start.items()}
    opt = SGD(0.1, 0.9, 0.01, (("p", 0.003),))
    state = opt.init(ours)
    theirs = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    reference = torch.optim.SGD(
        [{"params": [theirs["core.w"], theirs["core.b"]]}, {"params": [theirs["p"]], "lr": 0.003}],
        lr=0.1,
        momentum=0.9,
        weight_decay=0.01,
    )
    for step in range(3):
        grads = {k: torch.sin(v.detach() * (step + 1)) for k, v in theirs.items()}
        opt.step(ours, {k: torch.sin(ours[k] * (step + 1)) for k in ours}, state)
        for k, v in theirs.items():
            v.grad = grads[k]
        reference.step()
    for k in start:
        torch.testing.assert_close(ours[k], theirs[k].detach(), rtol=0, atol=1e-15)


def test_feddbe_steps_its_bias_by_plain_sgd_beside_the_models_momentum_and_weight_decay():
    """The reference steps the bias with its own plain torch.optim.SGD (`opt_client_mean`) and the model with the
    run's optimizer: FedDBE's phase does the same in one step."""
    sim = sim_for("feddbe", 0, dtype="float64", momentum=0.9, weight_decay=0.01)
    opt = sim.method.phases()[0].optimizer
    torch.manual_seed(0)
    start = {
        "body.w": torch.randn(3, 4, dtype=torch.float64),
        "head.b": torch.randn(4, dtype=torch.float64),
        "dbe.bias": torch.randn(5, dtype=torch.float64),
    }
    ours = {k: v.clone() for k, v in start.items()}
    state = opt.init(ours)
    assert set(state) == {"body.w", "head.b"}  # no momentum buffer for the bias
    theirs = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    model = torch.optim.SGD(
        [theirs["body.w"], theirs["head.b"]], lr=sim.method.training.lr, momentum=0.9, weight_decay=0.01
    )
    bias = torch.optim.SGD([theirs["dbe.bias"]], lr=sim.method.training.lr)
    for step in range(3):
        opt.step(ours, {k: torch.sin(ours[k] * (step + 1)) for k in ours}, state)
        for v in theirs.values():
            v.grad = torch.sin(v.detach() * (step + 1))
        model.step()
        bias.step()
    for k in start:
        torch.testing.assert_close(ours[k], theirs[k].detach(), rtol=0, atol=1e-15)


def test_apple_trains_its_own_core_and_its_relationship_vector_against_every_received_core():
    sim = sim_for("apple", 1, join_ratio="1", dtype="float64", rounds=30, hparams={"lr_p": 0.05})
    m, keys, n = sim.method, sim.method.net.param_keys, 6
    counts = torch.tensor(sim.data.train.counts, dtype=torch.float64)
    p0 = counts / counts.sum()  # p_0, the federation's sample shares (the authors' init_pss)
    assert all(torch.equal(sim.clients["apple.start"][i], p0) for i in range(n))
    assert (sim.clients["apple.weights"] - p0).abs().max() > 1e-4  # p_i learned in round 1
    for k in keys:  # each trained core is stored in its client's slot and comes back to it
        torch.testing.assert_close(sim.server["apple.cores." + k], sim.clients[k], rtol=0, atol=0)
    assert not torch.allclose(
        sim.server["apple.cores." + keys[0]][0], sim.server["apple.cores." + keys[0]][1], atol=1e-3
    )
    # λ(r), as the authors' get_reg_coef: L = ⌊30 · 0.1⌋ = 3
    mu = float(m.hp.mu)
    assert [float(m.pull(r)) for r in (1, 2, 3, 4)] == pytest.approx(
        [mu, mu * 0.001 ** (1 / 3), mu * 0.001 ** (2 / 3), 0.0]
    )
    state, (x, y) = client(sim, 2), batch(sim, 2)
    assert float(state["apple.reg"]) == pytest.approx(mu * 0.001 ** (1 / 3))  # round 2's pull
    state = {**state, "apple.weights": state["apple.weights"] + 0.01 * torch.arange(n, dtype=torch.float64)}  # p ≠ p_0
    trained = {**{k: state[k] for k in keys}, "apple.weights": state["apple.weights"]}
    g = grad(lambda t: m.loss({**state, **t}, sim.server, x, y))(trained)
    p = state["apple.weights"]
    cores = {k: sim.server["apple.cores." + k].clone() for k in keys}
    for k in keys:
        cores[k][2] = state[k]
    w = {k: torch.tensordot(p, cores[k], dims=1) for k in keys}  # w_2 = Σ_j p_j c_j
    ce = grad(lambda w: F.cross_entropy(m.net.logits({**state, **w}, x), y))(w)
    for k in keys:  # ∂/∂c_2 = p_22 ∂CE/∂w: the other cores are not trained
        torch.testing.assert_close(g[k], p[2] * ce[k])
    expected = torch.stack([sum((ce[k] * cores[k][j]).sum() for k in keys) for j in range(n)]) + 2 * state[
        "apple.reg"
    ] * (p - p0)
    torch.testing.assert_close(g["apple.weights"], expected)
    before = {k: sim.server["apple.cores." + k].clone() for k in keys}
    sim.step()
    after = client(sim, 2)
    # it predicts with w_2 as training left it: the others' cores as received, not as the server now holds them
    for k in keys:
        received = before[k].clone()
        received[2] = sim.server["apple.cores." + k][2]
        torch.testing.assert_close(after["apple.mix." + k], torch.tensordot(after["apple.weights"], received, dims=1))
    torch.testing.assert_close(
        m.logits(after, sim.server, x), m.net.logits({**after, **{k: after["apple.mix." + k] for k in keys}}, x)
    )


def test_fedas_aligns_the_received_body_to_its_prototypes_and_weighs_uploads_by_fisher_information():
    sim = sim_for("fedas", 1, join_ratio="0.5", dtype="float64", partition="dir:0.3")
    m, keys, body = sim.method, sim.method.net.param_keys, sim.method.net.keys(("body.",))
    align, train = m.phases()
    assert (
        align.trains == ("body.",)
        and align.batch == 16
        and align.epochs == 1
        and float(align.optimizer.lr) == 0.01
        and align.loss == m.alignment_loss
    )
    # receiving: prototypes of the client's own body, then the server's body in its place
    i = 2  # 266 samples: statistics calls 250 wide, and a partial batch to drop
    state = client(sim, i)
    x_all, y_all = sim.data.train.client(i)
    feats = m.net.features(state, sim.data.decode(x_all))
    stats = m.statistics(state, sim.server, sim.data.decode(x_all), y_all, torch.ones(len(y_all), dtype=torch.float64))
    took = m.begin_local(state, sim.server, stats, None)
    for c in range(10):
        rows = y_all == c
        assert bool(took["as.has"][c]) == bool(rows.any())
        if rows.any():
            torch.testing.assert_close(took["as.protos"][c], feats[rows].mean(0))
    for k in body:
        torch.testing.assert_close(took[k], sim.server[k])
    # the alignment loss, as the reference's loop over the batch's labels with MSELoss
    aligned = {**state, **took, **{k: sim.server[k] + 0.05 for k in body}}
    x, y = batch(sim, i, 16)
    f = m.net.features(aligned, x)
    expected = sum(
        F.mse_loss(f[y == c], took["as.protos"][c].expand(int((y == c).sum()), -1)) for c in y.unique().tolist()
    )
    torch.testing.assert_close(m.alignment_loss(aligned, sim.server, x, y), expected)
    assert expected > 1e-6
    # the Fisher trace: Σ over the client's consecutive whole batches of the run's size of ‖∇CE‖², the last partial
    # batch dropped
    b, n = m.training.batch_size, len(y_all)
    params = {k: state[k] for k in keys}
    trace = 0.0
    for start in range(0, n - b + 1, b):
        xb, yb = sim.data.decode(x_all[start : start + b]), y_all[start : start + b]
        g = grad(lambda p, xb=xb, yb=yb: F.cross_entropy(m.net.logits({**state, **p}, xb), yb))(params)
        trace += sum((v**2).sum() for v in g.values())
    at = sim.at(1, [i])
    summed = sim.executor.sum_over(
        m.trained_statistics,
        {k: v[[i]] for k, v in sim.clients.items()},
        sim.server,
        sim.data.train,
        "trained_statistics",
        at,
        0,
        b,
    )
    assert n % b and n > 256
    torch.testing.assert_close(summed["fim"][0], trace)
    # the server: Σ F_i θ_i / Σ F_i over the round's clients (the sample-weighted mean without client synchronization)
    before = {k: v.clone() for k, v in sim.server.items()}
    old = sim.clients[body[0]].clone()
    seen = []
    aggregate = m.aggregate
    m.aggregate = lambda server, up, at: (seen.append((up, at)), aggregate(server, up, at))[1]
    sim.step()
    up, at = seen[0]
    w = up["as.fim"] / up["as.fim"].sum()
    assert not torch.allclose(w, at.samples / at.samples.sum(), atol=1e-3)
    for k in body:
        torch.testing.assert_close(sim.server[k], torch.tensordot(w, up[k], dims=1))
        assert not torch.equal(sim.server[k], before[k])
    for j in range(6):  # nothing is broadcast: clients outside the round keep the body they trained last
        assert torch.equal(sim.clients[body[0]][j], old[j]) != (j in at.clients.tolist())
    nocs = sim_for("fedas-nocs", 2, join_ratio="1", dtype="float64")
    assert "as.fim" not in nocs.method.trained_statistics(
        client(nocs, 0), nocs.server, x, y, torch.ones(len(y), dtype=torch.float64)
    )
    assert len(sim_for("fedas-nopa").method.phases()) == 1


ROOT = Path(__file__).resolve().parents[1]


def methods_page_table(heading: str) -> tuple[str, list[list[str]]]:
    """docs/methods.md from `heading` on, and the rows of the first table after it, cells stripped."""
    page = (ROOT / "docs" / "methods.md").read_text()
    section = page[page.index(heading) :]
    table = next(block for block in section.split("\n\n") if block.startswith("| method |"))
    return section, [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]


def test_the_roster_table_on_the_methods_page_is_the_committed_runs():
    _, rows = methods_page_table("PFLlib's roster against its neighbours")
    by_title = {cls.title: name for name, cls in METHODS.items()}
    assert len(rows) == 21 and {r[0] for r in rows} >= {"FedALA", "FedCross", "FedKD", "FedGen", "APPLE"}
    for title, *cells in rows:
        name = by_title[title]
        run = (
            ROOT / "results" / ("baselines30/digits-dir0.1" if name in ("local", "fedavg") else "roster-digits") / name
        )
        acc = pd.read_parquet(run / "metrics.parquet").set_index("round")["acc"] * 100
        assert [float(c) for c in cells] == [round(acc[r], 2) for r in (1, 5, 10, 20, 30)] + [round(acc.max(), 2)], (
            title
        )


def test_the_fashion_mnist_roster_table_is_the_committed_runs_of_every_method():
    section, rows = methods_page_table("PFLlib's roster on Fashion-MNIST")
    runs = ROOT / "results" / "roster-fmnist"
    by_title = {cls.title: name for name, cls in METHODS.items()}
    shown = [by_title[r[0]] for r in rows]
    for name, (_, *cells, device) in zip(shown, rows, strict=True):
        run = pd.read_parquet(runs / name / "metrics.parquet").set_index("round")
        assert run.index.max() == 30, name
        acc = run["acc"] * 100
        assert [float(c) for c in cells] == [round(acc[r], 2) for r in (1, 10, 30)] + [round(acc.max(), 2)], name
        config = yaml.safe_load((runs / name / "config.yaml").read_text())
        assert (config["method"], config["rounds"], config["partition"], config["clients"]) == (name, 30, "dir:0.1", 20)
        assert config["device"].split(":")[0] == device, name
    assert shown[:2] == ["local", "fedavg"] and len(set(shown)) == len(shown)
    assert set(shown) == {m.name for m in ROSTER if m.name != "fedbn"} | {"local", "fedavg"}  # every roster method
    assert "FedBN is not in the table" in section
    # the page's CPU-against-GPU statement for FedAvg
    cpu, gpu = (
        pd.read_parquet(ROOT / "results" / f / "metrics.parquet").set_index("round")["acc"] * 100
        for f in ("roster-fmnist/fedavg", "roster-fmnist-cuda/fedavg")
    )
    assert round((cpu - gpu).abs().max(), 2) <= 0.09 and "within 0.09 points of its CPU row" in section


def test_fedbns_resnet18_row_is_its_committed_runs_beside_fedavg_and_local_only_on_that_backbone():
    """FedBN's row, on ResNet-18 (cnn4 has no batch norm): the methods page's table, its sentences and README's line,
    each figure from the three runs that shared one H200."""
    section, rows = methods_page_table("FedBN on ResNet-18")
    section = " ".join(section.split())
    runs = ROOT / "results" / "roster-fmnist-resnet18"
    by_title = {cls.title: name for name, cls in METHODS.items()}
    acc, times = {}, []
    for title, *cells, device in rows:
        name = by_title[title]
        run = pd.read_parquet(runs / name / "metrics.parquet").set_index("round")
        config = yaml.safe_load((runs / name / "config.yaml").read_text())
        assert (config["method"], config["partition"], config["clients"], config["backbone"], config["seed"]) == (
            name,
            "dir:0.1",
            20,
            "resnet18",
            0,
        )
        assert (
            config["device"].split(":")[0] == device == "cuda"
            and run.index.max() == 12
            and set(run["engine"]) == {"eager"}
        )
        acc[name] = run["acc"] * 100
        times.append(run["time_s"].median())
        assert [float(c) for c in cells] == [round(acc[name][r], 2) for r in (1, 5, 10, 12)] + [
            round(acc[name].max(), 2)
        ], name
    assert [by_title[r[0]] for r in rows] == ["local", "fedavg", "fedbn"]
    fedbn, fedavg = acc["fedbn"], acc["fedavg"]
    early = pd.concat([fedbn, fedavg]).loc[[1, 2, 3, 4]]
    assert (
        f"between {early.min():.2f} and {early.max():.2f}" in section
        and f"at {acc['local'][1]:.2f} after round 1" in section
    )
    assert (
        f"leads FedAvg in {(fedbn > fedavg).sum()} of the 12 rounds and by {fedbn[12] - fedavg[12]:.2f} "
        "points at round 12" in section
    )
    assert f"a median of {min(times):.1f} to {max(times):.1f} s a round" in section
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"FedBN {fedbn[12]:.2f}, FedAvg {fedavg[12]:.2f}, Local-only {acc['local'][12]:.2f} at round 12" in readme


def test_the_h100_rosters_timings_on_the_pages_are_its_committed_runs():
    """The thirteen runs that shared one H100 with a FedAvg run: each run's median round and the slowest run's whole
    time bound what the pages say of them (no figure of the GPU's use was kept, so none is written)."""
    folders = [
        d
        for d in (ROOT / "results" / "roster-fmnist").iterdir()
        if yaml.safe_load((d / "config.yaml").read_text())["device"].startswith("cuda")
    ]
    # FedAvg beside them, and FedALA's H100 run before its rerun
    folders += sorted((ROOT / "results" / "roster-fmnist-cuda").iterdir())
    fedavg = ROOT / "results" / "roster-fmnist-cuda" / "fedavg"
    times = {d: pd.read_parquet(d / "metrics.parquet")["time_s"] for d in folders}
    assert len(times) == 14
    medians = [t.median() for t in times.values()]
    slowest = max(times, key=lambda d: times[d].sum())
    rate = sum(len(t) for t in times.values()) / times[slowest].sum()
    said = (
        f"a median of {min(medians):.1f} to {max(medians):.1f} s a round each while they shared it (their "
        "`time_s`); the slowest, "
        f"FedGen, took {times[slowest].sum():.0f} s for its 30 rounds, so the fourteen ran at most {rate:.2f} "
        "rounds/s together"
    )
    assert slowest.name == "fedgen"
    for page in ("README.md", "docs/methods.md"):
        assert said in " ".join((ROOT / page).read_text().split()), page
    performance = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert (
        f"ran a median of {min(medians):.1f} to {max(medians):.1f} s a round each (FedAvg "
        f"{times[fedavg].median():.1f} s" in performance
    )
    assert (
        f"FedGen, took {times[slowest].sum():.0f} s for its 30 rounds, so together they ran at most {rate:.2f} rounds/s"
        in performance
    )
    assert "% busy" not in performance and "GPU use" not in performance


def test_the_server_optimizers_curves_on_the_methods_page_are_their_committed_runs():
    runs = ROOT / "results" / "baselines30" / "digits-dir0.1"
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    for name, title in (("local", "Local-only"), ("fedavg", "FedAvg"), ("fedadam", "FedAdam"), ("fedyogi", "FedYogi")):
        acc = pd.read_parquet(runs / name / "metrics.parquet").set_index("round")["acc"] * 100
        assert f"{title} " + " / ".join(f"{acc[r]:.1f}" for r in (1, 5, 10, 15, 20)) in page, name


def test_the_fedpac_server_figures_on_the_methods_page_are_the_committed_bench_output():
    page = (ROOT / "docs" / "methods.md").read_text()
    for clients in (20, 100):
        f = json.loads((ROOT / "results" / "bench" / f"fedpac-server-{clients}.json").read_text())["figures"]
        assert f["clients"] == clients and f["features"] == 512 and f["classes"] == 10
        assert f"| {clients} | {f['first round s']:.2f} s | {f['later rounds median s']:.3f} s |" in page


def test_the_digits_curves_the_methods_page_quotes_beside_its_table_are_committed_runs():
    """The reference form of FedLC, APPLE at ten times the lr and FedAS's ablations beside FedPer, on the digits split
    of the table (results/roster-digits/)."""
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    acc = lambda name: (  # noqa: E731
        pd.read_parquet(ROOT / "results" / "roster-digits" / name / "metrics.parquet").set_index("round")["acc"] * 100
    )
    at = lambda name, rounds: " / ".join(f"{acc(name)[r]:.2f}" for r in rounds)  # noqa: E731
    assert (
        "`fedlc-pfllib` (PFLlib's form: the federation's counts calibrate every client) reads "
        f"{at('fedlc-pfllib', (1, 5, 10, 20, 30))}" in page
    )
    assert f"it reads {at('apple-lr0.05', (5, 10, 20, 30))} at rounds 5 / 10 / 20 / 30" in page
    assert yaml.safe_load((ROOT / "results/roster-digits/apple-lr0.05/config.yaml").read_text())["lr"] == 0.05
    assert (
        f"`fedas-nopa` {at('fedas-nopa', (10, 30))}, `fedas-nocs` {at('fedas-nocs', (10, 30))} (FedPer, the "
        "same sharing without "
        f"either, {at('fedper', (10, 30))})"
    ) in page


def test_what_the_methods_page_says_of_the_personal_models_below_local_only_is_their_committed_runs():
    runs = ROOT / "results" / "roster-fmnist"
    acc = lambda name: pd.read_parquet(runs / name / "metrics.parquet").set_index("round")["acc"] * 100  # noqa: E731
    gaps = {name: acc("local") - acc(name) for name in ("fml", "fedkd", "fedgc", "fedas", "fedala")}
    every = pd.concat(gaps.values())
    at30 = [g[30] for g in gaps.values()]
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    assert (every > 0).all()
    assert (
        f"run below Local-only in every round (by {every.min():.2f} to {every.max():.2f} points; {min(at30):.2f} to "
        f"{max(at30):.2f} at round 30)"
    ) in page
    assert f"FedALA's round 1 ({acc('fedala')[1]:.2f}) is lower than its" in page


def test_the_swing_the_methods_page_quotes_of_fedgh_is_its_committed_run():
    acc = (
        pd.read_parquet(ROOT / "results" / "roster-fmnist" / "fedgh" / "metrics.parquet").set_index("round")["acc"]
        * 100
    )
    late = acc[acc.index >= 10]
    step = late.diff().abs()
    page = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    assert step.idxmax() == 17
    assert (
        f"after round 10 the accuracy moves by up to {step.max():.2f} points from one round to the next "
        f"({acc[16]:.2f} at round 16, "
        f"{acc[17]:.2f} at round 17; {acc[29]:.2f} at round 29, {acc[30]:.2f} at round 30)"
    ) in page
