"""Shared test helpers (import as `helpers.<module>`; tests/ is on sys.path)."""
