"""Paths the tests share: the checkout's root and the seed scenarios."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("seed-*.yaml"))
