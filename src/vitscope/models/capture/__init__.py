"""Where attention and tokens are read: attention sites, what each delivers per forward pass, and token layouts
(plain grids, Swin windows, PVT-v2 reduced keys, NaFlex padding, RoPE families)."""
