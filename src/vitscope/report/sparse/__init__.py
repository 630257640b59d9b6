"""The sparse-attention study's report page and its figures."""
