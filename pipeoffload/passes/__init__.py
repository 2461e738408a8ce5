"""Lowering passes: Schedule -> Schedule steps, chained in ``lower``."""
