"""HTTP service for embedrank (Litestar). Start with `litestar run` from the repo root."""
