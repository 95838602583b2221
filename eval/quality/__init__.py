"""Quality checks beside ``eval/run.py``: every architecture by backend (the support matrix), image-text towers
against sentence-transformers, compact vectors' quality."""
