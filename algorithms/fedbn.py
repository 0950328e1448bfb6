"""FedBN (Li et al., ICLR 2021): batch normalization stays local, so that each client normalizes its own feature shift.

Shared: every parameter except those of batch-norm layers. Personal: the batch-norm layers' weights
and biases (and, as for every method here, their running statistics).
Local loss: CE. Upload: the shared parameters. Server: their sample-weighted mean (as FedAvg).
Prediction: the client's model, with its own batch-norm layers.

Sources: the paper (Algorithm 1: everything but BN is averaged); PFLlib clientbn.py keeps local the
parameters whose names contain "bn", which on torchvision's ResNet-18 misses the batch norms of the
downsampling shortcuts (`downsample.1`); here every BatchNorm module's parameters, found by type. A
backbone without batch norm (cnn4, pac_cnn, mlp) would make FedBN FedAvg: refused with a sentence.
"""

from torch import nn

from algorithms.base import Method, Unsupported


class FedBN(Method):
    name = "fedbn"
    title = "FedBN"
    origin = "roster"
    paper = "Li et al., ICLR 2021"
    source = "the paper's Algorithm 1"

    def __init__(self, net, training, hp=None):
        super().__init__(net, training, hp)
        norms = [name for name, m in net.module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.local_norms = tuple(name + "." for name in norms)
        if not norms:
            raise Unsupported(
                "FedBN keeps batch-norm layers local and this backbone has none: run it with --set backbone=resnet18."
            )

    def is_shared(self, key):
        return super().is_shared(key) and not key.startswith(self.local_norms)
