"""The registers study (arXiv 2603.25803): the high-norm census, token probes, seed 004's claims judged, presets."""
