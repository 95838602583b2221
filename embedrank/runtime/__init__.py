"""Runtimes: what runs a transformer between embedrank's tokenization and its pooling or scoring.

``backends`` (torch, OpenVINO, ONNX Runtime), ``exports`` (turning a checkpoint into an OpenVINO or ONNX
model, cached on disk, and loading either) and ``packed`` (the padding-free torch forward pass). This layer
knows model files (``embedrank.registry``), never model semantics (pooling, prompts, chunking) or data.
"""
