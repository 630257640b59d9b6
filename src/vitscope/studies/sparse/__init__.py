"""The sparse-attention study (arXiv 2605.23868): DINO backbones by normaliser, measured and judged."""
