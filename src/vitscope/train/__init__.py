"""Training: protocols, the supervised trainer, checkpoints and distributed helpers."""

from vitscope.lazy_import import submodule_getattr
from vitscope.train.config import TrainConfig, load_config
from vitscope.train.protocols import ABLATION, COMPONENTS, Protocol, canonical_protocol, expand_conditions
from vitscope.train.trainer import TrainingDiverged, TrainingInterrupted, evaluate, make_objective, train

__all__ = [
    "ABLATION", "COMPONENTS", "Protocol", "TrainConfig", "TrainingDiverged", "TrainingInterrupted",
    "canonical_protocol", "evaluate", "expand_conditions", "load_config", "make_objective", "train",
]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
