"""Figures and reports built from results."""
