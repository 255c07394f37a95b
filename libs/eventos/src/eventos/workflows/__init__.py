"""Temporal workflow definitions. Sandboxed: they import only side-effect-free modules."""
