"""Dense probes (segmentation, depth) on frozen patch tokens: the probe, its heads, point-sampled losses, tiled
evaluation, sliding windows, and DINOv2's depth-bin normalisation."""
