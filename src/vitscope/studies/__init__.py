"""One pipeline per study."""
