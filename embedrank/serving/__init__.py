"""Serving without HTTP: the cross-request batching engine, model runners and allocator tuning."""
