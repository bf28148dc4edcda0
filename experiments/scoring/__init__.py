"""Scoring: per-question measures read from runs (failure tags, run-to-run regressions)."""
