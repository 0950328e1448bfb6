"""A backbone of one's own: a small CNN with BatchNorm, for images of any size (8x8 digits too).

`tuner run ... --set backbone=./examples/bn_cnn.py:build`. Every method relies on the split into a
feature extractor `body` and a classifier `head`, with `feature_dim` the size of body's output.
"""

from torch import nn

from tuner.models import Backbone


def build(input_shape: tuple[int, ...], num_classes: int) -> Backbone:
    channels = input_shape[0]
    body = nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 2 * 2, 128),
        nn.ReLU(),
    )
    return Backbone(body, nn.Linear(128, num_classes), feature_dim=128)
