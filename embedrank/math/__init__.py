"""Pure functions: pooling, normalization and similarity, ranking, fusion, retrieval metrics."""
