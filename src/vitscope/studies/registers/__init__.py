"""The registers study (arXiv 2603.25803): high-norm token census, token probes, findings and presets."""
