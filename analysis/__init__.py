"""Judging runs from their journals: bitwise comparison, metrics, verdicts."""
