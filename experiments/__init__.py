"""Experiment runner: YAML specs, matrix expansion, tidy results, metrics, plots and summaries."""
