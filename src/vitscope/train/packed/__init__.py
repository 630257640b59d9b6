"""Packed training: K supervised runs trained as one model, with a packed AdamW and per-member state."""
