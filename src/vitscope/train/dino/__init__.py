"""The DINO objective: the objective itself, the projection head and multi-crop network, and the loss."""
