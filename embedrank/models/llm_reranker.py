"""LLM rerankers in their causal-LM form: a prompt template around each (query, document) pair, scored by
the probability of "yes" against "no" as the next token.

Qwen3-Reranker's model card scores a pair by formatting it as ``<Instruct>: ...\\n<Query>: ...\\n<Document>: ...``,
tokenizing that body (cut at the max length minus the template's prefix and suffix), wrapping it in the chat
prefix and suffix, padding on the left, and taking ``softmax([logit(no), logit(yes)])[1]`` at the last
position. :class:`YesNoTokenizer` does the tokenizing part behind the tokenizer interface the cross-encoder
already uses (pairs in, token rows out, ``pad``), so batching, chunking, token counts and the service work
unchanged; the runtime (:class:`~embedrank.runtime.converters.YesNoLogit`) returns ``logit(yes) - logit(no)``,
whose sigmoid is that probability.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class YesNoTemplate:
    """The prompt an LLM reranker was trained with: ``prefix + body + suffix``, ``body`` formatted with the
    instruction, the query and the document."""

    prefix: str
    suffix: str
    body: str = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    instruction: str = "Given a web search query, retrieve relevant passages that answer the query"


QWEN3_RERANKER = YesNoTemplate(
    prefix=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    ),
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
)
"""Qwen3-Reranker's template, as its model card writes it (the default for causal-LM rerankers)."""


class YesNoTokenizer:
    """A Hugging Face tokenizer that encodes (query, document) pairs in a :class:`YesNoTemplate` and pads on
    the left; single texts (used for token offsets when splitting long documents) pass through unchanged.

    Truncation cuts the formatted body at ``max_length`` minus the prefix and suffix tokens, so the end of the
    document goes first, as in the model card.
    """

    is_fast = False  # pairs are encoded here, not by the fast tokenizer's overflow mapping
    padding_side = "left"

    def __init__(self, tokenizer: Any, template: YesNoTemplate = QWEN3_RERANKER) -> None:
        self.inner = copy.copy(tokenizer)
        self.inner.padding_side = "left"  # the answer is read at the last position of every row
        if self.inner.pad_token is None:
            self.inner.pad_token = self.inner.eos_token
        self.template = template
        self.prefix_ids = self.inner.encode(template.prefix, add_special_tokens=False)
        self.suffix_ids = self.inner.encode(template.suffix, add_special_tokens=False)

    def format(self, query: str, document: str) -> str:
        return self.template.body.format(instruction=self.template.instruction, query=query, document=document)

    def __call__(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        truncation: bool | str = False,
        max_length: int | None = None,
        **options: Any,
    ) -> dict[str, list[list[int]]]:
        if pairs is None:
            return self.inner(list(texts), truncation=truncation, max_length=max_length, **options)
        bodies = [self.format(q, d) for q, d in zip(texts, pairs, strict=True)]
        room = None
        if truncation and max_length is not None:
            room = max(1, max_length - len(self.prefix_ids) - len(self.suffix_ids))
        body_ids = self.inner(bodies, truncation=room is not None, max_length=room, verbose=False)["input_ids"]
        ids = [self.prefix_ids + b + self.suffix_ids for b in body_ids]
        rows = {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]}
        if options.get("padding") or options.get("return_tensors"):  # as a tokenizer call with these does
            return self.inner.pad(
                rows, padding=options.get("padding") or True, return_tensors=options.get("return_tensors")
            )
        return rows

    def pad(self, rows: Any, **options: Any) -> Any:
        return self.inner.pad(rows, **options)

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """Tokens a pair costs besides its query and document: the prefix, suffix and template text."""
        if not pair:
            return int(self.inner.num_special_tokens_to_add(pair=False))
        return len(self([""], [""])["input_ids"][0])

    def __getattr__(self, name: str) -> Any:  # vocabulary, special tokens, decoding: the wrapped tokenizer's
        if name == "inner":  # not set yet (a copy being built): no delegation, no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
