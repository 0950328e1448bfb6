import pytest
import torch

from tuner.defaults import paper_defaults
from tuner.errors import UserError
from tuner.models import BACKBONES, build_backbone

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
