"""The papers' defaults, in one table: what a run gets for every setting the user leaves unset.

A run follows a training protocol: `pfllib` (GPFL §4.1 and FedCP §4, both run in PFLlib, whose
conventions every baseline here shares) or `fedpac` (FedPAC Appendix B, also used for the
baselines of FedPAC's tables). A method's own paper picks its protocol (tuner/settings/papers.py); `protocol=fedpac`
runs any method under FedPAC's. Rules are read top to bottom, a later match overriding an
earlier one; a rule matches on protocol, method family, dataset and backbone (None: any).
The backbone is settled first (the user's, else the rules'), then everything else by it.
Used by `tuner run`, the search spaces' default point and `tuner reproduce`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROTOCOLS = ("pfllib", "fedpac")
FEDPAC_IMAGES = ("fmnist", "mnist", "emnist", "cifar10", "cinic10")  # the datasets FedPAC's CNNs are defined for


@dataclass(frozen=True)
class Rule:
    settings: dict[str, Any]
    source: str
    protocol: str | None = None
    method: tuple[str, ...] | None = None  # method families (variants follow their method)
    dataset: tuple[str, ...] | None = None
    backbone: tuple[str, ...] | None = None

    def matches(self, protocol: str, family: str, dataset: str, backbone: str | None) -> bool:
        return (
            self.protocol in (None, protocol)
            and (self.method is None or family in self.method)
            and (self.dataset is None or dataset in self.dataset)
            and (self.backbone is None or backbone in self.backbone)
        )


RULES = [
    # --- backbones
    Rule({"backbone": "cnn4"}, "GPFL §4.1 / FedCP §4: the 4-layer CNN for images"),
    Rule({"backbone": "mlp"}, "8x8 digits are too small for cnn4's two 5x5 convolutions", dataset=("digits",)),
    Rule({"backbone": "fasttext"}, "GPFL/FedCP: fastText for AG News", dataset=("agnews",)),
    Rule({"backbone": "harcnn"}, "GPFL: HAR-CNN for UCI HAR", dataset=("har",)),
    Rule({"backbone": "pac_cnn"}, "FedPAC B.1: its own CNNs", protocol="fedpac", dataset=FEDPAC_IMAGES),
    # --- the PFLlib protocol (GPFL and FedCP)
    Rule(
        {"lr": 0.005},
        "PFLlib's default step (main.py -lr 0.005), for backbones the papers do not name",
        protocol="pfllib",
    ),
    Rule(
        {
            "batch_size": 10,
            "local_epochs": 1,
            "momentum": 0.0,
            "weight_decay": 0.0,
            "groups": 5,
            "full_last_round": False,
            "augment": False,
            "normalize": "half",
        },
        "GPFL §4.1 / FedCP §4: batch 10, 1 epoch, plain SGD; PFLlib's Normalize(0.5, 0.5)",
    ),
    Rule({"lr": 0.005}, "GPFL §4.1 / FedCP §4: 0.005 for the 4-layer CNN (and the MLP)", backbone=("cnn4", "mlp")),
    Rule({"lr": 0.1}, "GPFL §4.1 / FedCP §4: 0.1 for ResNet-18 and fastText", backbone=("resnet18", "fasttext")),
    Rule({"lr": 0.01}, "GPFL §4.1: 0.01 for HAR-CNN", backbone=("harcnn",)),
    Rule({"lr": 0.01}, "FedPAC B.3: 0.01 for its CNN on greyscale images", backbone=("pac_cnn",)),
    # --- the FedPAC protocol (Appendix B)
    Rule(
        {
            "batch_size": 50,
            "local_epochs": 5,
            "momentum": 0.5,
            "weight_decay": 5e-4,
            "lr": 0.01,
            "full_last_round": True,
        },
        "FedPAC B.3: batch 50, E = 5, momentum 0.5, weight decay 5e-4, step 0.01; §5: full participation in "
        "the last round",
        protocol="fedpac",
    ),
    Rule(
        {"batch_size": 100, "groups": 3},
        "FedPAC B.2/B.3: EMNIST batch 100, 3 groups (digits, upper, lower)",
        protocol="fedpac",
        dataset=("emnist",),
    ),
    Rule(
        {"lr": 0.02, "augment": True, "normalize": "dataset"},
        "FedPAC B.3: step 0.02 on CIFAR-10/CINIC-10; its code: random crop + flip, per-dataset mean/std",
        protocol="fedpac",
        dataset=("cifar10", "cinic10"),
    ),
    # --- method hyperparameters beyond their modules' (CNN) defaults
    Rule(
        {"lam": 1e-4, "mu": 0.0},
        "GPFL's official scripts: λ = 1e-4, μ = 0 for ResNet-18 and fastText",
        method=("gpfl",),
        backbone=("resnet18", "fasttext"),
    ),
    Rule(
        {"lam": 0.01, "mu": 1.0},
        "GPFL's official scripts: λ = 0.01, μ = 1 for HAR-CNN",
        method=("gpfl",),
        backbone=("harcnn",),
    ),
    Rule(
        {"lam": 1.0},
        "FedCP Appendix D: λ = 1 for ResNet-18 and fastText (5 for the CNN)",
        method=("fedcp",),
        backbone=("resnet18", "fasttext"),
    ),
    # --- baselines by protocol. Module defaults are FedPAC Appendix B's tuned values (pFedMe λ = 10, K = 5;
    # Ditto λ = 1; APFL α = 0.25; FedFomo M = 5; pFedHN step 0.01) or the method's reference code where
    # FedPAC states none (FedBABU's 10 fine-tuning epochs, FedAMP's α_K = σ = λ = 1: PFLlib's defaults;
    # FedPHP's μ = 0.9: its authors' code). GPFL and FedCP state no baseline hyperparameter and
    # their tables ran PFLlib, but its defaults (main.py) are not ours, and for most they would make the
    # method another one: Ditto -mu 0 (no pull to the global model) with -pls 1 personal epoch; APFL
    # -al 1.0 (the local model alone, then adapted); FedPHP -mu 0 (no inheritance) with -lam 1.0 (MMD
    # only, no cross-entropy). Their runs must have passed other values, which are not published; the
    # modules' values stand for them. pFedMe's PFLlib default λ = 1 is a working value and is kept
    # below. FedProx's μ = 0.01 has no source (PFLlib's default μ = 0 is FedAvg).
    Rule(
        {"lam": 1.0},
        "PFLlib's default λ = 1 for pFedMe (main.py -lam; GPFL and FedCP state none)",
        protocol="pfllib",
        method=("pfedme",),
    ),
]
# What the table sets for the run; every other name a rule sets is a method hyperparameter.
RUN_SETTINGS = (
    "backbone",
    "lr",
    "batch_size",
    "local_epochs",
    "momentum",
    "weight_decay",
    "groups",
    "full_last_round",
    "augment",
    "normalize",
)


def paper_defaults(protocol: str, family: str, dataset: str, backbone: str | None) -> dict[str, Any]:
    """The table's settings for one run; `backbone` None lets the table choose it first."""
    if backbone is None:
        backbone = _merge([r for r in RULES if "backbone" in r.settings], protocol, family, dataset, None)["backbone"]
    return {
        **_merge([r for r in RULES if "backbone" not in r.settings], protocol, family, dataset, backbone),
        "backbone": backbone,
    }


def _merge(rules: list[Rule], protocol: str, family: str, dataset: str, backbone: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rule in rules:
        if rule.matches(protocol, family, dataset, backbone):
            out.update(rule.settings)
    return out
