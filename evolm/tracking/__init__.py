"""Tracking: results files, figures, progress, the final adapter, MLflow runs (and sweeps)."""
