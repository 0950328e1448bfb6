"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization",
ICLR 2021), written as a user of this tool writes a method: one file, outside the package. The tool also
has FedBN built in (`fedbn`, algorithms/fedbn.py); this file writes it again as the worked example of
docs/own_code.md, under a name of its own.

Shared: every parameter but BatchNorm's. Personal: each BatchNorm layer's weight and bias (its
running statistics stay with each client under every method here).
Local loss: cross-entropy, the whole model trained (FedAvg's).
Upload: the shared parameters. Server: their sample-weighted mean (FedAvg's).
Prediction: the client's own model, with its own BatchNorm.

    tuner run ./examples/fedbn.py:FedBN --dataset digits --partition dir:0.1 --clients 10 --rounds 20 --set
    backbone=./examples/bn_cnn.py:build
"""

from torch import nn

from algorithms import Method, Unsupported


class FedBN(Method):
    name = "my-fedbn"
    title = "My FedBN"

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        self.norm_layers = tuple(
            f"{n}." for n, m in net.module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
        )
        if not self.norm_layers:  # without BatchNorm, FedBN is FedAvg
            raise Unsupported(
                "FedBN keeps BatchNorm layers local and this backbone has none; use backbone=resnet18 or one "
                "of your own with BatchNorm."
            )

    def is_shared(self, key: str) -> bool:
        return super().is_shared(key) and not key.startswith(self.norm_layers)
