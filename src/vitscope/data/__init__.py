"""Datasets (decoded to uint8 tensors, or streamed from disk), the synthetic scene generator, and batching."""

from vitscope.data.dataset import ImageDataset, eval_batches, normalize
from vitscope.data.sources import DATASETS, load_dataset
from vitscope.data.stream import StreamedDataset
from vitscope.data.stream_sources import open_streamed
from vitscope.data.synthetic import SHAPES, synthetic_scenes
from vitscope.lazy_import import submodule_getattr

__all__ = ["DATASETS", "SHAPES", "ImageDataset", "StreamedDataset", "eval_batches", "load_dataset", "normalize",
           "open_streamed", "synthetic_scenes"]

__getattr__ = submodule_getattr(__name__)  # sub-modules on first use (PEP 562)
