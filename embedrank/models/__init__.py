"""Models: resolving a model id, tokenization, the encoder and cross-encoder, rerankers, weightless fakes."""
