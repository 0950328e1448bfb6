"""PFLlib's roster, what each method trains on: its local objective (distillation, contrast, regularizers,
prototypes, generators). Each test fails if the method's defining term is removed."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from simulations import batch, client, sim_for
from torch.func import grad

from algorithms.fedntd import not_true_kl
from tuner.engine.steps import step_gradient


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
        # and the loss distills from that eval-mode forward with the statistics the round began with (as the
        # authors' copy of the client model), not those the step's own forward moves, nor the batch's own
        received = m.net.logits({**state, **sim.server}, x)
        m.net.module.train()
        began = {**state, **{"ntd.stats." + k: state[k].clone() for k in m.net.buffer_keys}}  # begin_local's
        moved = {k: v.clone() for k, v in state.items()}
        local = m.net.logits(moved, x)
        tau, beta = m.hp.tau, m.hp.beta
        expected = F.cross_entropy(local, y) + beta * tau**2 * not_true_kl(local, received, y, tau)
        torch.testing.assert_close(m.loss({k: v.clone() for k, v in began.items()}, sim.server, x, y), expected)
        m.net.module.eval()
        after_the_step = m.net.logits({**moved, **sim.server}, x)
        m.net.module.train()
        in_train_mode = m.net.logits({k: v.clone() for k, v in {**state, **sim.server}.items()}, x)
        # the other teachers differ from it: the check can fail
        assert (after_the_step - received).abs().max() > 1e-6 and (in_train_mode - received).abs().max() > 1e-3


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
    clipped, _ = step_gradient(phase, m.loss)(params, rest, sim.server, x, y)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    m.loss({**rest, **leaves}, sim.server, x, y).backward()
    raw = torch.sqrt(sum((v.grad**2).sum() for v in leaves.values()))
    torch.nn.utils.clip_grad_norm_(list(leaves.values()), 10.0)
    for k in params:  # torch's own clip_grad_norm_ (at 10: whichever side of it this gradient falls)
        torch.testing.assert_close(clipped[k], leaves[k].grad)
    tight, _ = step_gradient(replace(phase, clip=float(raw) / 4), m.loss)(params, rest, sim.server, x, y)
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
