"""Probes of what a frozen backbone's features hold: image (linear, kNN), dense (segmentation, depth), token
(position, pixels, class), Point-in-Box and PCA maps.

Each probe is a function ``vitscope.probes.<probe>(model, dataset(s), ...)`` (the image and dense probes take one
settings object: ``ImageProbeSettings``, ``DenseProbeSettings``) returning a ``ProbeResult`` whose
rows follow the shared results schema and include a randomly initialised backbone and the chance level.
"""

from vitscope.lazy_import import submodule_getattr
from vitscope.probes.dense.probe import dense_probe
from vitscope.probes.dense.settings import DenseProbeSettings
from vitscope.probes.features import LayerFeatures, extract_features, parse_layers
from vitscope.probes.image import knn_probe, linear_probe
from vitscope.probes.linear import LinearClassifier, LinearRegressor, fit_classifier, fit_regressor
from vitscope.probes.pca import pca_maps
from vitscope.probes.pib import pib_probe
from vitscope.probes.results import ProbeResult
from vitscope.probes.settings import ImageProbeSettings, ProbeSettings
from vitscope.probes.tokens import probe_tokens

__all__ = [
    "DenseProbeSettings", "ImageProbeSettings", "LayerFeatures", "LinearClassifier", "LinearRegressor", "ProbeResult",
    "ProbeSettings", "dense_probe", "extract_features", "fit_classifier", "fit_regressor", "knn_probe", "linear_probe",
    "parse_layers", "pca_maps", "pib_probe", "probe_tokens",
]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
