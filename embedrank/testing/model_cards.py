"""Reference implementations of model cards' own scoring recipes, written with plain transformers and
nothing of embedrank, so that embedrank's implementation is checked against the recipe, not against itself."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np


def load_qwen3_reranker(path: str) -> tuple[Any, Any]:
    """The tokenizer (left padding) and the causal LM, as the card loads them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path, padding_side="left"), AutoModelForCausalLM.from_pretrained(path).eval()


def qwen3_reranker_scores(
    path: str, pairs: list[tuple[str, str]], max_length: int, *, loaded: tuple[Any, Any] | None = None
) -> np.ndarray:
    """Qwen3-Reranker's recipe exactly as its model card writes it: the P(yes) of each (query, document) pair,
    ``(N,)``, scored in one left-padded batch. ``loaded``: the card's ``(tokenizer, model)`` from
    :func:`load_qwen3_reranker`, to score again without loading."""
    import torch

    tokenizer, model = loaded or load_qwen3_reranker(path)
    token_false_id = tokenizer.convert_tokens_to_ids("no")
    token_true_id = tokenizer.convert_tokens_to_ids("yes")
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    prefix_tokens = tokenizer.encode(prefix, add_special_tokens=False)
    suffix_tokens = tokenizer.encode(suffix, add_special_tokens=False)
    instruction = "Given a web search query, retrieve relevant passages that answer the query"
    texts = [f"<Instruct>: {instruction}\n<Query>: {q}\n<Document>: {d}" for q, d in pairs]
    inputs = tokenizer(
        texts,
        padding=False,
        truncation="longest_first",
        return_attention_mask=False,
        max_length=max_length - len(prefix_tokens) - len(suffix_tokens),
    )
    for i, ele in enumerate(inputs["input_ids"]):
        inputs["input_ids"][i] = prefix_tokens + ele + suffix_tokens
    with warnings.catch_warnings():  # the card pads with max_length, which transformers says it ignores
        warnings.simplefilter("ignore", UserWarning)
        inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt", max_length=max_length)
    with torch.no_grad():
        batch_scores = model(**inputs).logits[:, -1, :]
    true_vector = batch_scores[:, token_true_id]
    false_vector = batch_scores[:, token_false_id]
    batch_scores = torch.nn.functional.log_softmax(torch.stack([false_vector, true_vector], dim=1), dim=1)
    return batch_scores[:, 1].exp().numpy()
