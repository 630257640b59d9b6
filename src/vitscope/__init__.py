"""vitscope: train, modify and measure how tokens interact inside Vision Transformers."""
__version__ = "0.1.0"
