"""embedrank: text embeddings and reranking for retrieval research and RAG services.

>>> import embedrank
>>> sorted(embedrank.__all__)[:3]
['BiEncoderScorer', 'CrossEncoder', 'CrossEncoderScorer']
"""

from embedrank.cross_encoder import CrossEncoder
from embedrank.encoder import Encoded, Encoder
from embedrank.errors import (
    DataNotFoundError,
    EmbedrankError,
    IndexMismatchError,
    IndexTrainingError,
    InputTooLongError,
    InvalidInputError,
    ModelKindError,
    ModelNotFoundError,
    NotAModelError,
    UnsupportedModelError,
)
from embedrank.pooling import PoolingMode, pool
from embedrank.ranking import rank_scores
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, ModelSpec, resolve
from embedrank.scorers import BiEncoderScorer, CrossEncoderScorer, Reranker, load_reranker
from embedrank.similarity import l2_normalize, similarity, truncate_dims

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "BiEncoderScorer",
    "CrossEncoder",
    "CrossEncoderScorer",
    "DataNotFoundError",
    "EmbedrankError",
    "Encoded",
    "Encoder",
    "IndexMismatchError",
    "IndexTrainingError",
    "InputTooLongError",
    "InvalidInputError",
    "ModelKindError",
    "ModelNotFoundError",
    "ModelSpec",
    "NotAModelError",
    "PoolingMode",
    "Reranker",
    "UnsupportedModelError",
    "l2_normalize",
    "load_reranker",
    "pool",
    "rank_scores",
    "resolve",
    "similarity",
    "truncate_dims",
]
