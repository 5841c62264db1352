"""Scores of citation QA: answer accuracy (EM, STR-EM, F1, ROUGE-L) and citation quality, and the QA report."""
