"""vitscope's own Vision Transformer: its config, presets, the packed K-model form and planted outliers."""
