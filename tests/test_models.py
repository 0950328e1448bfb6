import copy
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.func import functional_call, grad_and_value, vmap

from tuner.errors import UserError
from tuner.models import BACKBONES, CONV_FORMS, build_backbone, with_conv_form
from tuner.settings.defaults import paper_defaults

SHAPES = {
    "cnn4": [((1, 28, 28), 1024), ((3, 32, 32), 1600), ((3, 64, 64), 10816)],  # REFERENCE.md's flatten sizes
    "pac_cnn": [((1, 28, 28), 800), ((3, 32, 32), 576)],
    "resnet18": [((3, 32, 32), None)],
    "fasttext": [((200,), None)],
    "harcnn": [((9, 1, 128), None)],
    "mlp": [((1, 8, 8), None), ((3, 32, 32), None)],
}
FEATURES = {"cnn4": 512, "pac_cnn": 128, "resnet18": 512, "fasttext": 512, "harcnn": 1664, "mlp": 200}


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbones_split_into_body_and_head_with_known_k(name):
    for shape, flat in SHAPES[name]:
        net = build_backbone(name, shape, 7)
        x = torch.randint(0, 100, (2, *shape)) if name == "fasttext" else torch.randn(2, *shape)
        h = net.body(x)
        assert h.shape == (2, FEATURES[name]) and net.feature_dim == FEATURES[name]
        assert net.head(h).shape == (2, 7)
        if flat is not None:
            linear = [m for m in net.body.modules() if isinstance(m, torch.nn.Linear)][0]
            assert linear.in_features == flat


def test_small_images_get_a_fitting_default_and_a_clear_refusal():
    assert paper_defaults("pfllib", "fedavg", "digits", None)["backbone"] == "mlp"
    with pytest.raises(UserError, match="cannot take inputs of shape"):
        build_backbone("cnn4", (1, 8, 8), 10)
    with pytest.raises(UserError, match="needs image inputs"):
        build_backbone("cnn4", (200,), 4)


@pytest.mark.parametrize("form", [f for f in CONV_FORMS if f != "grouped"])
@pytest.mark.parametrize("name,shape", [("cnn4", (1, 28, 28)), ("pac_cnn", (3, 32, 32)), ("resnet18", (3, 32, 32))])
def test_each_conv_form_gives_the_grouped_forms_losses_and_gradients_under_vmap(name, shape, form):
    """Clients' own weights under vmap (each client's convolution), float64: the same loss and gradients."""
    torch.manual_seed(0)
    clients, batch = 3, 4
    grouped = build_backbone(name, shape, 10).double().eval()  # eval: BatchNorm reads its statistics, writes none
    formed = with_conv_form(copy.deepcopy(grouped), form)
    assert any(getattr(m, "form", None) == form for m in formed.modules())  # the form is the one that ran
    params = {k: torch.stack([v + 0.01 * i for i in range(clients)]) for k, v in grouped.named_parameters()}
    x, y = torch.randn(clients, batch, *shape, dtype=torch.float64), torch.randint(0, 10, (clients, batch))

    def gradients(net):
        def loss(p, x, y):
            return torch.nn.functional.cross_entropy(functional_call(net, p, (x,)), y)

        return vmap(grad_and_value(loss))(params, x, y)

    (g_grouped, l_grouped), (g_formed, l_formed) = gradients(grouped), gradients(formed)
    torch.testing.assert_close(l_formed, l_grouped, rtol=1e-12, atol=1e-12)
    for k in g_grouped:
        torch.testing.assert_close(g_formed[k], g_grouped[k], rtol=1e-10, atol=1e-12)


def test_a_run_computes_its_convolutions_in_the_form_it_names():
    from tuner.federated_run import build_method
    from tuner.settings.config import RunConfig

    cfg = RunConfig(method="fedavg", dataset="digits", backbone="mlp", conv_form="unfold").resolved()
    images = SimpleNamespace(
        train=SimpleNamespace(y=torch.arange(10), counts=[5, 5]),
        num_classes=10,
        num_clients=2,
        input_shape=(1, 28, 28),
        vocab=None,
    )
    net = build_method(replace(cfg.settings(), backbone="cnn4").resolved(), images).net.module
    assert [m.form for m in net.modules() if isinstance(m, torch.nn.Conv2d)] == ["unfold", "unfold"]
    with pytest.raises(UserError, match="Unknown conv_form 'winograd'; choose one of grouped, unfold\\."):
        RunConfig(method="fedavg", dataset="digits", conv_form="winograd").resolved()


def test_under_vmap_a_convolution_receives_nchw_whatever_the_layout_handed_in():
    """Why there is no channels_last form: an input laid out NHWC reaches the convolution so outside vmap, but vmap's
    rule folds the clients into the channels with a contiguous copy, so the kernel sees NCHW (the form that did this
    measured 1.03x grouped, the copy's cost). A torch that keeps the layout fails here: then the form is worth
    adding."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Layouts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution.default:
                seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
            return func(*args, **(kwargs or {}))

    conv = torch.nn.Conv2d(3, 8, 5)
    params = {k: v.detach().expand(4, *v.shape).clone() for k, v in conv.named_parameters()}
    nhwc = torch.randn(4, 10, 28, 28, 3).permute(0, 1, 4, 2, 3)  # clients, batch, then C, H, W over NHWC memory
    with Layouts():
        conv(nhwc[0])
        torch.func.vmap(lambda p, x: torch.func.functional_call(conv, p, (x,)))(params, nhwc)
    assert seen == [True, False]
