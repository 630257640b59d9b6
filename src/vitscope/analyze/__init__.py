"""Analyses of a trained (or loaded) model over a dataset."""

from vitscope.analyze.locality import LocalityResult, measure_locality, write_locality

__all__ = ["LocalityResult", "measure_locality", "write_locality"]
