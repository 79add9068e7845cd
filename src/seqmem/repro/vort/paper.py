"""The VORT paper's numbers (Tables 1-3), as data."""

from __future__ import annotations

PAPER_T1 = {"PL": (91.3, 87.6, 79.4), "Exp": (90.8, 81.2, 52.3), "Mix-5": (91.0, 83.7, 61.8)}
PAPER_T2 = {"PL": (93.1, 89.4, 82.7), "Exp": (92.6, 83.1, 58.4), "Mix-5": (92.9, 85.8, 65.2)}
PAPER_T3 = {"PL": (1.84, 1.71, 1.62, 1.56), "Exp": (1.85, 1.74, 1.69, 1.68), "Mix-5": (1.84, 1.73, 1.67, 1.63)}
