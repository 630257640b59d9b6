"""Datasets (decoded to uint8 tensors), the synthetic scene generator, and batching."""

from vitscope.data.dataset import ImageDataset, eval_batches, normalize
from vitscope.data.sources import DATASETS, load_dataset
from vitscope.data.synthetic import SHAPES, synthetic_scenes

__all__ = ["DATASETS", "SHAPES", "ImageDataset", "eval_batches", "load_dataset", "normalize", "synthetic_scenes"]
