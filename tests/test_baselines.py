"""The baselines of the papers' tables: what makes each that method, exact resume, and that each
personalised one beats FedAvg's global model on a pathological split (as its paper says)."""

import pytest
import torch
import torch.nn.functional as F
from simulations import batch, client, sim_for
from torch.func import grad
from typer.testing import CliRunner

from algorithms import METHODS
from tuner.cli import app


@pytest.mark.slow
@pytest.mark.parametrize(
    "method", [name for name, m in METHODS.items() if m.origin in ("baseline", "roster") and not m.family]
)
def test_resume_from_a_state_dict_is_exact(method):
    import io

    # bitwise equal, in the precision the equality tests use
    cfg = dict(join_ratio="0.5-1", val_frac=0.2, dtype="float64")
    straight = sim_for(method, 1, **cfg)  # resumed after round 1: round 2 is where round 1's uploads come back
    checkpoint = io.BytesIO()
    torch.save(straight.state_dict(), checkpoint)  # written as a checkpoint is, before round 2 moves anything
    straight.step()
    resumed = sim_for(method, **cfg)
    # as `tuner run --resume` reads it
    resumed.load_state_dict(torch.load(io.BytesIO(checkpoint.getvalue()), weights_only=True))
    resumed.step()
    for k, v in straight.clients.items():
        assert torch.equal(resumed.clients[k], v), k
    assert straight.history[-1]["acc"] == resumed.history[-1]["acc"]


# Points above FedAvg's global model after five rounds on pathological digits, each method at its defaults.
PERSONALISED = {
    m: 0.1
    for m in (
        "pfedme",
        "ditto",
        "apfl",
        "fedrod",
        "fedbabu",
        "lg-fedavg",
        "fedproto",
        "hypcluster",
        "fedamp",
        "fedphp",
        "fedfomo",
        "pfedhn",
        "knn-per",
    )
}
PERSONALISED["per-fedavg"] = 0.05  # one SGD step of personalisation from the global model (measured +8 points)
# its E-step once a round (Algorithm 1) learns the mixture slowly at first (measured +8.4)
PERSONALISED["fedem-ft-m3"] = 0.05


@pytest.mark.slow
def test_personalised_baselines_beat_fedavgs_global_model_on_pathological_digits():
    cfg = dict(clients=10, partition="pat:2")
    fedavg = sim_for("fedavg", 5, **cfg).history[-1]["best_acc"]
    for method, margin in PERSONALISED.items():
        assert sim_for(method, 5, **cfg).history[-1]["best_acc"] > fedavg + margin, method


def test_scaffold_server_control_is_the_mean_of_the_clients_controls():
    sim = sim_for("scaffold", 3, join_ratio="0.5", clients=6)
    for k in sim.method.net.param_keys:
        mean = sim.clients["scaffold.ci." + k].mean(0)
        assert sim.server["scaffold.c." + k].abs().sum() > 0
        torch.testing.assert_close(sim.server["scaffold.c." + k], mean, atol=1e-6, rtol=1e-4)


def linear(input_shape, num_classes):
    """Multinomial logistic regression: a convex problem."""
    from torch import nn

    from tuner.models import Backbone

    size = int(torch.tensor(input_shape).prod())
    return Backbone(nn.Flatten(), nn.Linear(size, num_classes), size)


@pytest.mark.slow
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_scaffold_control_variates_settle_on_a_convex_problem_under_the_runs_optimizer(monkeypatch, momentum):
    # Option II divides the drift by K η; under momentum m the steps travel about 1 / (1 − m) further, so
    # with K η the controls overshoot and flip sign each round (consecutive changes at cosine ≈ −0.8).
    monkeypatch.setitem(__import__("tuner.models").models.BACKBONES, "linear", linear)
    sim = sim_for(
        "scaffold",
        0,
        backbone="linear",
        partition="dir:0.3",
        momentum=momentum,
        local_epochs=2,
        dtype="float64",
        rounds=30,
    )
    controls = []
    for _ in range(30):
        sim.step()
        controls.append(
            torch.cat([sim.clients["scaffold.ci." + k].flatten(1) for k in sim.method.net.param_keys], 1).clone()
        )
    changes = [b - a for a, b in zip(controls, controls[1:], strict=False)]
    late = range(len(changes) - 10, len(changes))
    relative = sum((changes[i].norm() / controls[i + 1].norm()).item() for i in late) / 10
    turning = sum(F.cosine_similarity(changes[i - 1].flatten(), changes[i].flatten(), 0).item() for i in late) / 10
    assert relative < 0.12 and turning > -0.5, (relative, turning)


def test_scaffold_local_step_adds_the_control_difference_to_the_gradient():
    sim = sim_for("scaffold", 1)
    m, state = sim.method, client(sim, 0)
    x, y = batch(sim, 0)
    params = {k: state[k] for k in m.net.param_keys}
    g_method = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))(params)
    g_plain = grad(lambda p: F.cross_entropy(m.net.logits({**state, **p}, x), y))(params)
    for k in params:
        torch.testing.assert_close(g_method[k] - g_plain[k], sim.server["scaffold.c." + k] - state["scaffold.ci." + k])


def test_fedbabu_head_never_trains_but_is_fine_tuned_for_evaluation():
    sim = sim_for("fedbabu", eval_gap=99)  # no evaluation: its fine-tuning is what costs
    head = {k: sim.clients[k].clone() for k in sim.method.net.keys(("head.",))}
    sim.step()
    sim.step()
    for k, v in head.items():
        assert torch.equal(sim.clients[k], v)
        assert torch.equal(v[0], v[1])  # the same random head on every client
    assert [p.trains for p in sim.method.eval_phases()] == [("body.", "head.")]


def distance_to_global(sim):
    keys = sim.method.net.param_keys
    return sum(((sim.clients[k] - sim.server["global." + k]) ** 2).sum() for k in keys).item()


def test_ditto_trains_the_personal_model_as_many_epochs_as_the_global_one_unless_told():
    assert [p.epochs for p in sim_for("ditto", local_epochs=3).method.phases()] == [
        3,
        3,
    ]  # litian96/ditto: the same local_iters
    assert [p.epochs for p in sim_for("ditto", local_epochs=3, hparams={"personal_epochs": 1}).method.phases()] == [
        3,
        1,
    ]


def test_fine_tuning_baselines_tune_for_the_runs_local_epochs_as_fedpacs_and_fedems_code():
    for method in ("fedavg_ft", "fedem-ft-m3", "fedem-ft-m5"):
        assert [p.epochs for p in sim_for(method, local_epochs=5).method.eval_phases()] == [5], method
    assert sim_for("fedem-m3", local_epochs=5).method.eval_phases() == []
    assert [p.epochs for p in sim_for("fedavg_ft", local_epochs=5, hparams={"ft_epochs": 2}).method.eval_phases()] == [
        2
    ]


def test_ditto_pulls_the_personal_model_to_the_global_one_by_lambda():
    loose = sim_for("ditto", 2, hparams={"lam": 0.0}, eval_gap=99)
    tight = sim_for("ditto", 2, hparams={"lam": 10.0}, eval_gap=99)
    assert distance_to_global(tight) < 0.5 * distance_to_global(loose)
    assert sim_for("ditto").method.passes.upload and set(tight.server) == {
        "global." + k for k in tight.method.net.param_keys
    }


def test_apfl_keeps_or_learns_alpha_within_0_1_and_predicts_with_the_mixture():
    assert torch.equal(sim_for("apfl", 1, eval_gap=99).clients["apfl.alpha"], torch.full((6,), 0.25))
    sim = sim_for("apfl", 2, hparams={"adapt_alpha": True}, eval_gap=99)
    alpha = sim.clients["apfl.alpha"]
    assert ((alpha >= 0) & (alpha <= 1)).all() and not torch.allclose(alpha, torch.full_like(alpha, 0.25))
    m, state = sim.method, client(sim, 0)
    x = batch(sim, 0, 5, "test")[0]
    state["apfl.alpha"] = torch.tensor(0.0)
    torch.testing.assert_close(m.logits(state, sim.server, x), m.net.logits(state, x, "global."))
    state["apfl.alpha"] = torch.tensor(1.0)
    torch.testing.assert_close(m.logits(state, sim.server, x), m.net.logits(state, x))


def test_apfl_outputs_form_mixes_the_two_models_logits_and_the_global_model_learns_only_from_its_own_loss():
    sim = sim_for("apfl-outputs", 1, eval_gap=99)
    m, state = sim.method, client(sim, 0)
    x, y = batch(sim, 0)
    local, global_ = m.net.logits(state, x), m.net.logits(state, x, "global.")
    # FedTorch's inference_personal
    torch.testing.assert_close(m.logits(state, sim.server, x), 0.25 * local + 0.75 * global_)
    parameters = sim_for("apfl", 1, eval_gap=99).method
    # the paper's v̄ differs
    assert not torch.allclose(parameters.logits(state, sim.server, x), m.logits(state, sim.server, x), atol=1e-3)
    keys = [k for k in state if k.startswith("global.") and not m.net.is_buffer(k)]
    g = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))({k: state[k] for k in keys})
    own = grad(lambda p: F.cross_entropy(m.net.logits({**state, **p}, x, "global."), y))({k: state[k] for k in keys})
    for k in keys:
        torch.testing.assert_close(g[k], own[k])  # the mix is detached from w


def test_fedrod_balanced_softmax_uses_the_clients_label_distribution_and_the_personal_head_adds_on():
    sim = sim_for("fedrod", 1)
    m, state = sim.method, client(sim, 0)
    y = sim.data.train.client(0)[1]
    prior = torch.bincount(y, minlength=10).float() / len(y)
    torch.testing.assert_close(state["rod.log_prior"].exp(), prior, atol=1e-6, rtol=0)
    x = batch(sim, 0, 5, "test")[0]
    z = m.net.features(state, x)
    torch.testing.assert_close(m.logits(state, sim.server, x), m.net.head(state, z) + m.net.head(state, z, "rod.head."))
    # the personal objective's gradient reaches the personal head only
    xb, yb = batch(sim, 0)
    params = {k: state[k] for k in m.net.param_keys}
    personal = lambda p: (  # noqa: E731
        m.loss({**state, **p}, sim.server, xb, yb)
        - F.cross_entropy(m.net.head({**state, **p}, m.net.features({**state, **p}, xb)) + state["rod.log_prior"], yb)
    )
    assert all(g.abs().sum() == 0 for g in grad(personal)(params).values())


def test_fedproto_prototypes_are_count_weighted_class_means_and_prediction_is_the_nearest():
    sim = sim_for("fedproto", 1, join_ratio="1")
    m = sim.method
    sums = torch.zeros(10, m.net.feature_dim)
    counts = torch.zeros(10)
    for i in range(sim.data.num_clients):
        x, y = sim.data.train.client(i)
        f = m.net.features(client(sim, i), sim.data.decode(x))
        sums.index_add_(0, y, f.detach())
        counts += torch.bincount(y, minlength=10)
    torch.testing.assert_close(sim.server["proto.global"], sums / counts[:, None], atol=1e-4, rtol=1e-4)
    state = client(sim, 0)
    x = batch(sim, 0, 5, "test")[0]
    f = m.net.features(state, x)
    nearest = torch.cdist(f, sim.server["proto.global"]).argmin(1)
    assert torch.equal(m.logits(state, sim.server, x).argmax(1), nearest)
    assert not any(k.startswith(("body.", "head.")) for k in sim.server)  # no weights leave a client


def test_fedproto_loss_is_cross_entropy_plus_lambda_times_the_reference_mse_to_the_class_prototypes():
    # The reference's MSELoss averages over features too; λ = 1 was set in that scale (a sum over
    # 512 features diverged on Fashion-MNIST dir:0.1).
    sim = sim_for("fedproto", 1, join_ratio="1", hparams={"lam": 2.0})
    m, state = sim.method, client(sim, 0)
    x, y = batch(sim, 0, 8)
    f = m.net.features(state, x)
    expected = F.cross_entropy(m.net.head(state, f), y) + 2.0 * F.mse_loss(f, sim.server["proto.global"][y])
    torch.testing.assert_close(m.loss(state, sim.server, x, y), expected)


def test_lg_fedavg_shares_the_head_and_keeps_bodies_local():
    sim = sim_for("lg-fedavg", 2, join_ratio="1")
    assert torch.equal(sim.clients["head.weight"][0], sim.clients["head.weight"][1])
    body = sim.method.net.keys(("body.",))[0]
    assert not torch.equal(sim.clients[body][0], sim.clients[body][1]) and body not in sim.server


def test_per_fedavg_steps_on_the_adapted_models_gradient():
    sim = sim_for("per-fedavg", 1)
    m, state = sim.method, client(sim, 0)
    b = m.training.batch_size
    (phase,) = m.phases()  # PFLlib: β = lr, draws of 2B split into D and D', client training twice a round
    assert (phase.optimizer.lr, phase.batch, phase.epochs) == (m.training.lr, 2 * b, 2 * m.training.local_epochs)
    x, y = batch(sim, 0, 2 * b)
    params = {k: state[k] for k in m.net.param_keys}
    ce = lambda p, a, b: F.cross_entropy(m.net.logits({**state, **p}, a), b)  # noqa: E731
    inner = grad(ce)(params, x[:b], y[:b])
    adapted = {k: params[k] - m.training.lr * inner[k] for k in params}
    expected = grad(ce)(adapted, x[b:], y[b:])  # first order: the gradient at w̃ on the second batch of B
    got = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))(params)
    for k in params:
        torch.testing.assert_close(got[k], expected[k])
    m.hp.second_order = True
    exact = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))(params)
    assert any(not torch.allclose(exact[k], expected[k]) for k in params)
    assert [(p.steps, p.optimizer.lr) for p in m.eval_phases()] == [(1, m.training.lr)]


def test_every_table_baseline_is_a_method():
    assert {"scaffold", "per-fedavg", "ditto", "apfl", "fedrod", "fedbabu", "lg-fedavg", "fedproto"} <= set(METHODS)


def test_pfedme_solves_the_envelope_and_moves_w_towards_theta():
    sim = sim_for("pfedme", 1)
    m, state = sim.method, client(sim, 0)
    x, y = batch(sim, 0)
    keys = m.net.param_keys
    theta = m.personal(state, x, y)
    envelope = lambda th: (  # noqa: E731
        F.cross_entropy(m.net.logits({**state, **th}, x), y)
        + m.hp.lam / 2 * sum(((th[k] - state[k]) ** 2).sum() for k in keys)
    )
    start = {k: state["me." + k] for k in keys}
    assert envelope(theta) < envelope(start)  # K steps descend eq. 7 from the current θ
    params = {k: state[k] for k in keys} | {"me." + k: state["me." + k] for k in keys}
    g = grad(lambda p: m.loss({**state, **p}, sim.server, x, y))(params)
    for k in keys:
        torch.testing.assert_close(g[k], m.hp.lam * (state[k] - theta[k]))  # eq. 8
        torch.testing.assert_close(state["me." + k] - m.training.lr * g["me." + k], theta[k])  # θ lands on θ*


def test_pfedme_theta_starts_each_round_from_the_received_model():
    """θ trains away from w first (with personal_lr 0 θ would stay w, and a θ carried over would pass unseen)."""
    sim = sim_for("pfedme", 1, join_ratio="1")
    sim.step()
    m, state = sim.method, client(sim, 0)
    keys = m.net.param_keys
    assert not all(torch.allclose(state["me." + k], state[k]) for k in keys)  # θ_i after round 1 is not the received w
    started = m.begin_local(state, sim.server, {}, sim.at(2, [0]).client(0))
    for k in keys:  # round 2 starts θ_i from the received model, not from round 1's θ_i
        torch.testing.assert_close(started["me." + k], sim.server[k])


def test_pfedme_official_predicts_with_w_i_as_local_training_left_it_and_decays_theta():
    sim = sim_for("pfedme-official", 0, join_ratio="1", dtype="float64")
    m, keys = sim.method, sim.method.net.param_keys
    sim._local_round(sim.at(1, list(range(sim.data.num_clients))))
    trained = {k: sim.clients[k].clone() for k in keys}  # w_i after round 1, before the server's model comes back
    sim.round = 1  # as Simulation.step goes on: every client takes the server's model, then evaluation
    sim._broadcast(list(range(sim.data.num_clients)))
    state, x = client(sim, 0), batch(sim, 0, split="test")[0]
    assert not torch.allclose(state[keys[0]], trained[keys[0]][0])  # the received model replaced w_0 ...
    w0 = {k: trained[k][0] for k in keys}
    # ... yet w_0 as trained predicts
    torch.testing.assert_close(m.logits(state, sim.server, x), m.net.logits({**state, **w0}, x))
    assert not torch.allclose(m.logits(state, sim.server, x), m.net.logits(state, x, "me."))  # not θ_0
    # the inner steps carry pFedMeOptimizer's weight decay μ = 0.001 on θ: one step from θ = w, λ = 0
    paper = METHODS["pfedme"](m.net, m.training, m.Hparams(lam=0.0, inner_steps=1))
    official = METHODS["pfedme-official"](m.net, m.training, m.Hparams(lam=0.0, inner_steps=1))
    xb, yb = batch(sim, 0)
    theta_paper, theta_official = paper.personal(state, xb, yb), official.personal(state, xb, yb)
    for k in keys:
        torch.testing.assert_close(theta_official[k] - theta_paper[k], -paper.hp.personal_lr * 0.001 * state["me." + k])


def test_hypcluster_clients_take_the_model_of_lowest_loss_and_clusters_average_their_choosers():
    sim = sim_for("hypcluster", 1, join_ratio="1", hparams={"k": 3})
    m = sim.method
    before = {k: v.clone() for k, v in sim.server.items()}
    sim.step()
    choice = sim.clients["hyp.choice"]
    assert torch.equal(choice.sum(1), torch.ones(6))
    for i in range(6):  # the choice is the model of lowest loss on the client's training data, before training
        x, y = sim.data.train.client(i)
        losses = [
            F.cross_entropy(
                m.net.logits({k: before["hyp.model." + k][j] for k in m.net.param_keys}, sim.data.decode(x)),
                y,
                reduction="sum",
            )
            for j in range(3)
        ]
        assert choice[i].argmax() == torch.stack(losses).argmin()
    n = torch.tensor(sim.data.train.counts, dtype=torch.float32)
    key = m.net.param_keys[0]
    for j in range(3):
        w = choice[:, j] * n
        if w.sum() > 0:
            expected = torch.tensordot(w / w.sum(), sim.clients[key], dims=1)
            torch.testing.assert_close(sim.server["hyp.model." + key][j], expected, atol=1e-6, rtol=1e-4)


def test_fedem_mixture_weights_are_mean_responsibilities_and_prediction_is_the_mixture():
    sim = sim_for("fedem", 2)
    m, state = sim.method, client(sim, 0)
    pi = state["em.pi"]
    assert pi.sum().item() == pytest.approx(1.0) and not torch.allclose(pi, torch.full_like(pi, 1 / 3))
    x = batch(sim, 0, 5, "test")[0]
    probs = torch.stack(
        [F.softmax(m.net.logits({k: state["em.model." + k][j] for k in m.net.param_keys}, x), -1) for j in range(3)]
    )
    torch.testing.assert_close(m.logits(state, sim.server, x).exp(), torch.tensordot(pi, probs, dims=1))


def test_fedem_ft_predicts_with_the_authors_uniform_weights_unless_told_pi():
    for mix in ("uniform", "pi"):
        sim = sim_for("fedem-ft-m3", 2, hparams={"ft_mix": mix})
        m, state = sim.method, client(sim, 0)
        weights = torch.full((3,), 1 / 3) if mix == "uniform" else state["em.pi"]
        assert mix == "uniform" or not torch.allclose(weights, torch.full((3,), 1 / 3))
        x = batch(sim, 0, 5, "test")[0]
        probs = torch.stack(
            [F.softmax(m.net.logits({k: state["em.model." + k][j] for k in m.net.param_keys}, x), -1) for j in range(3)]
        )
        torch.testing.assert_close(m.logits(state, sim.server, x).exp(), torch.tensordot(weights, probs, dims=1))
    res = CliRunner().invoke(app, ["run", "fedem-ft-m3", "--dataset", "digits", "--set", "ft_mix=average"])
    assert res.exit_code == 2 and "ft_mix" in res.output and "Traceback" not in res.output, res.output


def test_fedem_m_step_weighs_samples_by_the_e_steps_responsibilities_fixed_through_the_round():
    sim = sim_for("fedem", 1)
    m, state = sim.method, client(sim, 0)
    x, y = batch(sim, 0)
    moved = {
        **state,
        **{k: v + 0.05 * torch.randn_like(v) for k, v in state.items() if k.startswith("em.model.")},
    }  # the M-step's steps
    params = [k for k in state if k.startswith("em.model.") and k[len("em.model.") :] in m.net.param_keys]
    g = grad(lambda p: m.loss({**moved, **p}, sim.server, x, y))({k: moved[k] for k in params})
    weighted = lambda q: grad(lambda p: -(q * m.log_likelihoods({**moved, **p}, x, y)).sum(0).mean())(  # noqa: E731
        {k: moved[k] for k in params}
    )
    # the round's start
    q_estep = m.responsibilities(state["em.estep.em.pi"], m.log_likelihoods(state, x, y, "em.estep.em.model."))
    # recomputed from the moved components
    q_moving = m.responsibilities(state["em.estep.em.pi"], m.log_likelihoods(moved, x, y))
    expected, per_batch = weighted(q_estep), weighted(q_moving)
    for k in params:
        torch.testing.assert_close(g[k], expected[k])
    assert any(not torch.allclose(g[k], per_batch[k]) for k in params)


def test_fedamp_cloud_models_weigh_similar_clients_more():
    sim = sim_for("fedamp", 1, join_ratio="1", hparams={"sigma": 50.0, "alpha_k": 5.0})
    m, keys = sim.method, sim.method.net.param_keys
    uploads = {k: sim.clients[k].clone() for k in keys}
    uploads = {k: v.clone() for k, v in uploads.items()}
    for k in keys:  # clients 1 and 2 copy client 0; the others stay apart
        uploads[k][1] = uploads[k][0] + 1e-3
        uploads[k][2] = uploads[k][0] - 1e-3
    out = m.aggregate(sim.server, uploads, sim.at(1, list(range(6))))
    k = keys[0]
    cloud, own = out["amp.u." + k][0], uploads[k][0]
    near = (cloud - own).norm() / (uploads[k][3] - own).norm()
    assert near < 0.5  # client 0's aggregate sits with its look-alikes, not at the federation's mean
    assert not torch.allclose(out["amp.u." + k][0], out["amp.u." + k][3])  # one personalised aggregate per client


def test_fedamp_attention_is_exact_for_nearly_equal_models_among_many_clients():
    sim = sim_for("fedamp", 0, clients=30, partition="iid", hparams={"sigma": 1e-6, "alpha_k": 1e-6})
    m, keys = sim.method, sim.method.net.param_keys
    g = torch.Generator().manual_seed(0)
    uploads = {
        k: v + torch.randn(v.shape, generator=g) for k, v in sim.clients.items() if k in keys
    }  # the others far apart
    for k in keys:  # client 1 next to client 0: beyond 25 rows cdist's matrix-product path rounds this distance to 0
        uploads[k][1] = uploads[k][0] + 1e-4 * (uploads[k][0].numel() ** -0.5)
    out = m.aggregate(sim.server, uploads, sim.at(1, list(range(30))))
    flat = lambda d, i: torch.cat([d[k][i].flatten().double() for k in keys])  # noqa: E731
    delta = flat(uploads, 1) - flat(uploads, 0)
    xi = torch.exp(-(delta**2).sum() / 1e-6)  # eq. 6 in float64: α_K e^{-d/σ} / σ with α_K = σ
    taken = ((flat({k[len("amp.u.") :]: v for k, v in out.items()}, 0) - flat(uploads, 0)) @ delta) / (delta @ delta)
    assert 0.5 < xi < 1 and taken.item() == pytest.approx(xi.item(), rel=1e-2)  # u_0 = (1 − ξ) w_0 + ξ w_1


def test_fedphp_trains_from_the_global_model_towards_the_private_one_and_inherits_after_training():
    sim = sim_for("fedphp", 2, join_ratio="1", rounds=4)
    m, k = sim.method, sim.method.net.param_keys[0]
    state, server = client(sim, 0), sim.server
    torch.testing.assert_close(state[k], server[k])  # the client's model is the received global one
    assert not torch.allclose(state["php.private." + k], server[k])  # its private model (HPM) is its own
    x, y = batch(sim, 0)
    keys = m.net.param_keys + ["php.private." + q for q in m.net.param_keys]
    g = grad(lambda p: m.loss({**state, **p}, server, x, y))({p: state[p] for p in keys})
    assert all(g["php.private." + q].abs().sum() == 0 for q in m.net.param_keys)  # the teacher is not trained
    assert g[k].abs().sum() > 0 and m.loss(state, server, x, y) != m.loss(
        {**state, "php.private." + k: server[k]}, server, x, y
    )
    trained = {**state, k: state[k] + 1.0}
    mu = m.hp.mu * 2 / 4  # two earlier rounds of training out of ρT = 4
    out = m.end_local(trained, server, {}, sim.at(3, [0]).client(0))
    torch.testing.assert_close(out["php.private." + k], mu * state["php.private." + k] + (1 - mu) * trained[k])
    assert torch.equal(m.upload(trained, server)[k], trained[k])  # the model trained from the global one goes up
    torch.testing.assert_close(m.logits(state, server, x), m.net.logits(state, x, "php.private."))  # the HPM predicts


def test_fedphp_pfllib_form_inherits_on_receipt_and_learns_from_the_global_teacher():
    sim = sim_for("fedphp-pfllib", 2, join_ratio="1", rounds=4)
    m, k = sim.method, sim.method.net.param_keys[0]
    state, server = client(sim, 0), sim.server
    mu = m.hp.mu * 2 / 4  # round 3 of 4: two rounds done (PFLlib's R = 2)
    received = m.broadcast(state, server, sim.at(3, [0]).client(0))
    torch.testing.assert_close(received[k], (1 - mu) * server[k] + mu * state[k])
    # round 1; after round 4, for evaluation
    first, last = (m.broadcast(state, server, sim.at(n, [0]).client(0))[k] for n in (1, 5))
    torch.testing.assert_close(first, server[k])  # round 1 trains from the global model alone (R = 0)
    # μ after the last round, never more
    torch.testing.assert_close(last, (1 - m.hp.mu) * server[k] + m.hp.mu * state[k])
    torch.testing.assert_close(received["php.teacher." + k], server[k])
    x, y = batch(sim, 0)
    params = {p: received[p] for p in m.net.param_keys + ["php.teacher." + q for q in m.net.param_keys]}
    g = grad(lambda p: m.loss({**received, **p}, server, x, y))(params)
    assert all(g["php.teacher." + q].abs().sum() == 0 for q in m.net.param_keys)  # the teacher is not trained


def test_knn_per_interpolates_the_global_model_with_neighbours_from_the_clients_own_data():
    sim = sim_for("knn-per", 1)
    m = sim.method
    everyone = sim.at(1, list(range(6)))
    memory = sim._memory(sim.method, sim.clients, everyone)
    sim.settings.eval_batch = 16  # the datastore is built a batch at a time: the same rows
    for k, v in sim._memory(sim.method, sim.clients, everyone).items():
        torch.testing.assert_close(v, memory[k])
    n = sim.data.train.counts[2]
    assert torch.equal(memory["knn.labels"][2][:n], sim.data.train.client(2)[1]) and memory["knn.mask"][2].sum() == n
    state = client(sim, 2) | {k: v[2] for k, v in memory.items()}
    x, _ = batch(sim, 2, 5, "test")
    m.hp.lam = 0.0
    torch.testing.assert_close(m.logits(state, sim.server, x).exp(), F.softmax(m.net.logits(state, x), -1))
    m.hp.lam, m.hp.k = 1.0, 1
    nearest = torch.cdist(m.net.features(state, x), memory["knn.keys"][2][:n]).argmin(1)
    assert torch.equal(m.logits(state, sim.server, x).argmax(1), memory["knn.labels"][2][nearest])


def test_knn_per_neighbour_weights_are_smooth_on_wide_features_so_a_confident_model_can_outvote_them():
    from torch import nn

    from algorithms.knnper import KNNPer, KNNPerHparams
    from algorithms.net import Net
    from algorithms.rounds import Training
    from tuner.models import Backbone

    d, classes = 128, 40
    m = KNNPer(
        Net(Backbone(nn.Identity(), nn.Linear(d, classes), d)),
        Training(0.1, 1, 10, classes, clients=1),
        KNNPerHparams(k=10, lam=1.0),
    )
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(30, d, generator=g)  # features of a 128-wide extractor: squared distances ~ 2d apart
    bias = torch.zeros(classes)
    bias[35] = 30.0  # the model is sure of class 35, which no neighbour has
    state = {
        "head.weight": torch.zeros(classes, d),
        "head.bias": bias,
        "knn.keys": keys,
        "knn.labels": torch.arange(30),
        "knn.mask": torch.ones(30),
    }
    x = keys[:1] + 0.5 * torch.randn(1, d, generator=g)
    assert m.logits(state, None, x).exp().max() < 0.9  # λ = 1: the kNN vote alone, not one-hot over 10 distinct labels
    m.hp.lam = 0.6  # FedPAC's grid: 0.5 … 0.8
    assert m.logits(state, None, x).argmax(1).item() == 35  # the model's logits change the prediction


def test_knn_per_chooses_lambda_on_the_grid_by_leave_one_out_accuracy_on_its_own_datastore():
    from torch import nn

    from algorithms.knnper import LAMBDA_GRID, KNNPer, KNNPerHparams
    from algorithms.net import Net
    from algorithms.rounds import Training
    from tuner.models import Backbone

    d, classes, n = 8, 4, 40
    m = KNNPer(
        Net(Backbone(nn.Identity(), nn.Linear(d, classes), d)),
        Training(0.1, 1, 10, classes, clients=1),
        KNNPerHparams(),
    )
    assert m.hp.k == 7 and m.hp.lam is None
    g = torch.Generator().manual_seed(1)
    labels = torch.arange(n) % classes
    # neighbours know the label
    keys = 3 * F.one_hot(labels, d).double() + torch.randn(n, d, generator=g, dtype=torch.float64)
    head = {
        "head.weight": torch.randn(classes, d, generator=g, dtype=torch.float64),
        "head.bias": torch.zeros(classes, dtype=torch.float64),
    }
    state = {**head, "knn.keys": keys, "knn.labels": labels, "knn.mask": torch.ones(n, dtype=torch.float64)}

    def loo_accuracy(lam):  # each sample predicted by the model and its 7 nearest other samples
        right = 0
        for i in range(n):
            others = torch.cat([torch.arange(i), torch.arange(i + 1, n)])
            d2 = ((keys[others] - keys[i]) ** 2).sum(1)
            near = d2.topk(7, largest=False)
            w = torch.exp(-near.values / d) / torch.exp(-near.values / d).sum()
            knn = torch.zeros(classes, dtype=torch.float64).index_add_(0, labels[others][near.indices], w)
            model = F.softmax(keys[i] @ head["head.weight"].T, -1)
            right += int((lam * knn + (1 - lam) * model).argmax() == labels[i])
        return right

    scores = [loo_accuracy(lam) for lam in LAMBDA_GRID]
    assert len(set(scores)) > 1  # the choice matters here
    assert m.chosen_lambda(state).item() == LAMBDA_GRID[scores.index(max(scores))]
    padded = {
        **state,
        "knn.keys": torch.cat([keys, torch.zeros(5, d, dtype=torch.float64)]),
        "knn.labels": torch.cat([labels, torch.zeros(5, dtype=torch.long)]),
        "knn.mask": torch.cat([state["knn.mask"], torch.zeros(5, dtype=torch.float64)]),
    }
    assert m.chosen_lambda(padded).item() == m.chosen_lambda(state).item()  # padding is never a neighbour nor counted
    x = keys[:3] + 0.1
    m.hp.mix = "logits"  # the original scripts' form: kNN probabilities mixed with the model's logits
    lam = m.chosen_lambda(state)
    knn = m.knn(x, state, 0 * keys[:, 0][None])
    torch.testing.assert_close(m.logits(state, None, x), lam * knn + (1 - lam) * (x @ head["head.weight"].T))
