"""Evaluation: BEIR-style benchmark runs (the logic behind ``eval/run.py``)."""
