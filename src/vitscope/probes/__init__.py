"""Probes of what a frozen backbone's features hold: linear and kNN read-outs, dense and token probes."""

from vitscope.probes.linear import LinearClassifier, LinearRegressor, fit_classifier, fit_regressor

__all__ = ["LinearClassifier", "LinearRegressor", "fit_classifier", "fit_regressor"]
