"""Retrieval: BEIR collections, the embedding cache, vector indexes, BM25, retrieve-then-rerank."""
