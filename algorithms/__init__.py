"""pFL methods, one module per method; each reads like its paper's algorithm box.

Ablations and variants are the same method with other hyperparameter defaults, registered
under the papers' names in lower case (`gpfl-nocov`, `fedcp-nocpn-nogh`, `fedpac-fa`, `apfl-outputs`, ...).
The reference code's forms, where it departs from its paper, are small subclasses that override
only what differs (`gpfl-pfllib`, `fedcp-gumbel`, `fedphp-pfllib`, `pfedme-official`, `fedpac-official`,
`fedpac-pfllib`, `fedlc-pfllib`,
`fedcac-pfllib`).
Methods of one's own live outside this package and are named by file or entry point (tuner/plugins.py).
"""

from algorithms import apfl, fedas, fedcp, fedem, fedpac, gpfl, hypcluster, knnper
from algorithms.apfl import APFL
from algorithms.apple import APPLE
from algorithms.base import Method, Unsupported
from algorithms.common import weighted_mean
from algorithms.ditto import Ditto
from algorithms.fd import FD
from algorithms.fedala import FedALA
from algorithms.fedamp import FedAMP
from algorithms.fedavg import FedAvg
from algorithms.fedavg_ft import FedAvgFT
from algorithms.fedbabu import FedBABU
from algorithms.fedbn import FedBN
from algorithms.fedcac import FedCAC, FedCACPfllib
from algorithms.fedcross import FedCross
from algorithms.feddbe import FedDBE
from algorithms.feddyn import FedDyn
from algorithms.fedfomo import FedFomo
from algorithms.fedgc import FedGC
from algorithms.fedgen import FedGen
from algorithms.fedgh import FedGH
from algorithms.fedkd import FedKD
from algorithms.fedlc import FedLC, FedLCPfllib
from algorithms.fedmtl import FedMTL
from algorithms.fedntd import FedNTD
from algorithms.fedopt import FedAdam, FedYogi
from algorithms.fedpcl import FedPCL
from algorithms.fedper import FedPer
from algorithms.fedphp import FedPHP, FedPHPPfllib
from algorithms.fedproto import FedProto
from algorithms.fedprox import FedProx
from algorithms.fedrep import FedRep
from algorithms.fedrod import FedRoD
from algorithms.fml import FML
from algorithms.knnper import KNNPer
from algorithms.lgfedavg import LGFedAvg
from algorithms.local import Local
from algorithms.moon import MOON
from algorithms.net import Net
from algorithms.optimizers import SGD, Adam, Yogi
from algorithms.perfedavg import PerFedAvg
from algorithms.pfedhn import PFedHN
from algorithms.pfedme import PFedMe, PFedMeOfficial
from algorithms.pflda import PFLDA
from algorithms.rounds import Passes, Phase, Round, Training
from algorithms.scaffold import SCAFFOLD
from algorithms.variants import variant

BASELINES = [
    FedAvg,
    FedProx,
    SCAFFOLD,
    Local,
    FedAvgFT,
    PerFedAvg,
    PFedMe,
    Ditto,
    APFL,
    FedPer,
    FedRep,
    FedRoD,
    FedBABU,
    LGFedAvg,
    FedPHP,
    FedProto,
    FedAMP,
    FedFomo,
    KNNPer,
    PFedHN,
    hypcluster.HypCluster,
    fedem.FedEM,
    FedAdam,
    FedYogi,
]
# Methods of PFLlib's roster beyond the papers' tables (issue: every method of PFLlib's list).
ROSTER = [
    FedLC,
    FedNTD,
    FedDyn,
    MOON,
    FedBN,
    FML,
    FD,
    PFLDA,
    FedGH,
    FedCAC,
    FedPCL,
    FedMTL,
    FedGen,
    FedDBE,
    FedKD,
    FedGC,
    FedCross,
    FedALA,
    APPLE,
    fedas.FedAS,
]
REFERENCE_FORMS = [
    FedPHPPfllib,
    PFedMeOfficial,
    gpfl.GPFLPfllib,
    fedcp.FedCPGumbel,
    fedpac.FedPACOfficial,
    fedpac.FedPACPfllib,
    FedLCPfllib,
    FedCACPfllib,
]
_ALL = [
    *BASELINES,
    *ROSTER,
    *apfl.VARIANTS,
    *fedas.VARIANTS,
    *knnper.VARIANTS,
    *hypcluster.VARIANTS,
    *fedem.VARIANTS,
    gpfl.GPFL,
    *gpfl.VARIANTS,
    fedcp.FedCP,
    *fedcp.VARIANTS,
    fedpac.FedPAC,
    *fedpac.VARIANTS,
    *REFERENCE_FORMS,
]
METHODS: dict[str, type[Method]] = {m.name: m for m in _ALL}

# The public interface a method of one's own is written against (docs/own_code.md, "Add your method in one file").
__all__ = [
    "METHODS",
    "SGD",
    "Adam",
    "Method",
    "Net",
    "Passes",
    "Phase",
    "Round",
    "Training",
    "Unsupported",
    "Yogi",
    "variant",
    "weighted_mean",
]
