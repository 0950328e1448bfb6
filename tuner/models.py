"""Backbones, each split into a feature extractor (`body`) and a head, with feature size K.

Methods only see this split: parameter names start with "body." or "head.". Layer shapes
follow the papers' reference code (REFERENCE.md); flatten sizes are found by a dry run, so a
backbone builds for any input the dataset gives or says plainly why it cannot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tuner.errors import UserError
from tuner.plugins import is_reference, load_object


class Backbone(nn.Module):
    def __init__(self, body: nn.Module, head: nn.Module, feature_dim: int):
        super().__init__()
        self.body = body
        self.head = head
        self.feature_dim = feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _flat_size(layers: nn.Module, input_shape: tuple[int, ...], name: str) -> int:
    layers.eval()  # a dry run must not touch BatchNorm statistics
    try:
        with torch.no_grad():
            return int(layers(torch.zeros(1, *input_shape)).flatten(1).shape[1])
    except RuntimeError:
        raise UserError(
            f"Backbone {name} cannot take inputs of shape {tuple(input_shape)} (its convolutions shrink them "
            "to nothing); choose backbone=mlp for small images."
        ) from None
    finally:
        layers.train()


def _image_shape(input_shape, name):
    if len(input_shape) != 3:
        raise UserError(
            f"Backbone {name} needs image inputs (channels, height, width), not shape {tuple(input_shape)}."
        )


def cnn4(input_shape, num_classes):
    """GPFL/FedCP's 4-layer CNN (PFLlib FedAvgCNN), K = 512."""
    _image_shape(input_shape, "cnn4")
    convs = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    dim = _flat_size(convs, input_shape, "cnn4")
    return Backbone(nn.Sequential(convs, nn.Linear(dim, 512), nn.ReLU()), nn.Linear(512, num_classes), 512)


def pac_cnn(input_shape, num_classes):
    """FedPAC's CNNs (Appendix B.1): two convs for grey images, a third for colour ones; K = 128."""
    _image_shape(input_shape, "pac_cnn")
    layers = [
        nn.Conv2d(input_shape[0], 16, 5),
        nn.LeakyReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=1),
        nn.LeakyReLU(),
        nn.MaxPool2d(2),
    ]
    if input_shape[0] == 3:
        layers += [nn.Conv2d(32, 64, 3, padding=1), nn.LeakyReLU(), nn.MaxPool2d(2)]
    convs = nn.Sequential(*layers, nn.Flatten())
    dim = _flat_size(convs, input_shape, "pac_cnn")
    return Backbone(nn.Sequential(convs, nn.Linear(dim, 128), nn.LeakyReLU()), nn.Linear(128, num_classes), 128)


def resnet18(input_shape, num_classes):
    """torchvision ResNet-18 from scratch (ImageNet stem), K = 512; BatchNorm statistics stay per client."""
    import torchvision

    _image_shape(input_shape, "resnet18")
    net = torchvision.models.resnet18(num_classes=num_classes)
    if input_shape[0] != 3:
        net.conv1 = nn.Conv2d(input_shape[0], 64, 7, 2, 3, bias=False)
    head, net.fc = net.fc, nn.Identity()
    _flat_size(net, input_shape, "resnet18")
    return Backbone(net, head, 512)


class MeanEmbedding(nn.Module):
    """fastText's bag of embeddings: the mean over all (padded) token positions, as in PFLlib."""

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim, padding_idx=0)

    def forward(self, tokens):
        return self.embedding(tokens).mean(1)


def fasttext(input_shape, num_classes, vocab: int = 32000):
    if len(input_shape) != 1:
        raise UserError(f"Backbone fasttext needs token sequences, not inputs of shape {tuple(input_shape)}.")
    body = nn.Sequential(MeanEmbedding(vocab, 512), nn.Linear(512, 512))
    return Backbone(body, nn.Linear(512, num_classes), 512)


def harcnn(input_shape, num_classes):
    """HAR-CNN for UCI HAR (9 channels x 128 steps); its head is a 3-layer MLP, K = 1664."""
    if len(input_shape) != 3:
        raise UserError(f"Backbone harcnn needs (channels, 1, steps) signals, not shape {tuple(input_shape)}.")
    body = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, (1, 9)),
        nn.ReLU(),
        nn.MaxPool2d((1, 2)),
        nn.Conv2d(32, 64, (1, 9)),
        nn.ReLU(),
        nn.MaxPool2d((1, 2)),
        nn.Flatten(),
    )
    dim = _flat_size(body, input_shape, "harcnn")
    head = nn.Sequential(nn.Linear(dim, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, num_classes))
    return Backbone(body, head, dim)


def mlp(input_shape, num_classes):
    """A 3-layer MLP (two hidden layers of 200 and the head), K = 200: fits any input size."""
    dim = int(torch.tensor(input_shape).prod())
    body = nn.Sequential(nn.Flatten(), nn.Linear(dim, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU())
    return Backbone(body, nn.Linear(200, num_classes), 200)


BACKBONES = {"cnn4": cnn4, "pac_cnn": pac_cnn, "resnet18": resnet18, "fasttext": fasttext, "harcnn": harcnn, "mlp": mlp}


def backbone_for(input_shape: tuple[int, ...]) -> str:
    """A user's data without a backbone named: the 4-layer CNN for images it fits (16x16 and up), else the MLP."""
    return "cnn4" if len(input_shape) == 3 and min(input_shape[1:]) >= 16 else "mlp"


# How a convolution is computed (`conv_form`), the same numbers each: under vmap, torch's rule makes one grouped
# convolution of every client's (`grouped`, which cuDNN runs client by client); `unfold` is im2col and a matrix
# product (a batched matmul across clients). An NHWC layout cannot be handed in: vmap's rule folds the clients into
# the channels, a contiguous NCHW copy (tests/test_models.py shows it), so no `channels_last` form.
CONV_FORMS = ("grouped", "unfold")


class FormedConv2d(nn.Conv2d):
    """A Conv2d computed in `form` (CONV_FORMS): its parameters, names and results stay the layer's."""

    form = "grouped"

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.form == "grouped":
            return super()._conv_forward(input, weight, bias)
        n, _, h, w = input.shape
        (kh, kw), (ph, pw), (dh, dw), (sh, sw) = self.kernel_size, self.padding, self.dilation, self.stride
        columns = F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)  # (n, c*kh*kw, L)
        out = weight.flatten(1) @ columns  # (n, out channels, L)
        if bias is not None:
            out = out + bias[:, None]
        return out.view(n, -1, (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1)


def with_conv_form(net: nn.Module, form: str) -> nn.Module:
    """The backbone's 2-d convolutions computed in `form`; a layer unfold cannot take (groups, padding by name or
    not with zeros) stays grouped."""
    if form == "grouped":
        return net
    for layer in net.modules():
        if type(layer) is nn.Conv2d:
            unfoldable = layer.groups == 1 and layer.padding_mode == "zeros" and not isinstance(layer.padding, str)
            layer.__class__ = FormedConv2d  # the same layer, its forward another form's
            layer.form = form if form != "unfold" or unfoldable else "grouped"
    return net


def build_backbone(name: str, input_shape: tuple[int, ...], num_classes: int, vocab: int | None = None) -> Backbone:
    """vocab: for token inputs, how many token ids the data has (fastText's embedding rows; 32000 unless given).
    `name` may also be a function of one's own, FILE.py:NAME or module:NAME (tuner/plugins.py)."""
    if is_reference(name):
        return users_backbone(name, tuple(input_shape), num_classes, vocab is not None)
    if name not in BACKBONES:
        raise UserError(
            f"Unknown backbone '{name}'; choose one of {', '.join(BACKBONES)}, or name your own as "
            "path/to/file.py:function."
        )
    if name == "fasttext" and vocab is not None:
        return fasttext(tuple(input_shape), num_classes, vocab)
    return BACKBONES[name](tuple(input_shape), num_classes)


def users_backbone(name: str, input_shape: tuple[int, ...], num_classes: int, tokens: bool) -> nn.Module:
    """A backbone from the user's function (input_shape, num_classes) -> module, checked for what every
    method relies on: `body` and `head` submodules holding every parameter, and `feature_dim`, the
    body's output size, which the head takes in and maps to num_classes."""
    build = load_object(name, "Backbone")
    if not callable(build):
        raise UserError(
            f"Backbone {name} is not a function; name one that takes (input_shape, num_classes) and returns a module."
        )
    try:
        net = build(input_shape, num_classes)
    except Exception as e:
        raise UserError(f"Backbone {name}({input_shape}, {num_classes}) failed: {type(e).__name__}: {e}") from None
    parts = [p for p in ("body", "head") if not isinstance(getattr(net, p, None), nn.Module)]
    if not isinstance(net, nn.Module) or parts:
        raise UserError(
            f"Backbone {name} must return an nn.Module with submodules body and head (missing: "
            f"{', '.join(parts) or 'a module'})."
        )
    if not isinstance(getattr(net, "feature_dim", None), int):
        raise UserError(f"Backbone {name}'s module needs feature_dim, the size of body's output (an int).")
    stray = [k for k, _ in net.named_parameters() if not k.startswith(("body.", "head."))]
    if stray:
        raise UserError(
            f"Backbone {name} has parameter {stray[0]} outside body and head; methods share and personalize "
            "only those two."
        )
    x = torch.zeros(2, *input_shape, dtype=torch.long if tokens else torch.float32)
    net.eval()
    try:
        with torch.no_grad():
            h = net.body(x)
            out = net.head(h)
    except Exception as e:
        raise UserError(f"Backbone {name} cannot take inputs of shape {input_shape}: {type(e).__name__}: {e}") from None
    finally:
        net.train()
    if tuple(h.shape) != (2, net.feature_dim):
        raise UserError(
            f"Backbone {name}'s body gives features of shape {tuple(h.shape[1:])} per sample, not "
            f"({net.feature_dim},) as its feature_dim says."
        )
    if tuple(out.shape) != (2, num_classes):
        raise UserError(
            f"Backbone {name}'s head gives {tuple(out.shape[1:])} per sample, not the data's {num_classes} classes."
        )
    return net
