"""Tracking: results files, figures, progress (and, later, MLflow)."""
