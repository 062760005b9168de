"""Shared test helpers (import as `helpers.<module>`; tests/ is on sys.path)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
