"""PFLlib's roster, what each method keeps, sends, receives and mixes: personal parts, compressed uploads, the
server's mixing and weighting, and the optimizers they step with. Each test fails if the method's defining term is
removed."""

import pytest
import torch
import torch.nn.functional as F
from simulations import batch, client, sim_for
from torch.func import grad


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_feddbe_carries_the_running_mean_of_features_from_step_to_step(executor):
    # lr 1e-200: the model stays where it is (float64 cannot hold such a step), so each step's batch mean is known from
    # the batch schedule
    from tuner.engine.draws import batch_schedule

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
    # PFLlib's KLDivLoss(): its default "mean", over every element
    kl = lambda a, b: F.kl_div(a, b, reduction="sum") / a.numel()  # noqa: E731
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
    from tuner.engine.draws import RECEIVE_STREAM, batch_schedule

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
    from tuner.engine.draws import sample_cohort

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


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_fedalas_weight_learning_leaves_the_clients_batchnorm_statistics_as_they_were(executor):
    """PFLlib learns W on a copy of the local model that it discards (ALA.py `model_t`): the pass trains W in
    train mode, batch statistics and all, and the client's running statistics stay the client's."""
    from tuner.engine.draws import RECEIVE_STREAM

    sim = sim_for("fedala", 1, join_ratio="1", dtype="float64", executor=executor, backbone="tiny_batchnorm")
    at = sim.at(2, list(range(6)))
    cohort = {k: v.clone() for k, v in sim.clients.items()}
    before = {k: v.clone() for k, v in cohort.items()}
    sim.executor.train(sim.method.receive_phases(), cohort, sim.server, at, RECEIVE_STREAM)
    stats = [k for k in cohort if sim.method.net.is_buffer(k)]
    assert stats and all(torch.equal(cohort[k], before[k]) for k in stats)
    assert any(not torch.equal(cohort[k], before[k]) for k in cohort if k.startswith("ala.w."))  # W learned
