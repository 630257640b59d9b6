"""Finding and reading weights: the local hub caches, checkpoint files and their origins, position-table resizing."""
