"""The root exception of the analysis package."""
from __future__ import annotations


class AnalysisError(Exception):
    """A journal is missing, unreadable or inconsistent."""
