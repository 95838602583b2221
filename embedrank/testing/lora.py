"""What the LoRA tests adapt, shared by the runtime's tests (against PEFT) and the encoder's (against
sentence-transformers with PEFT): the linear layers of each tiny architecture that their adapters target, and the
texts they compare on (of several lengths, so that padding and packing matter)."""

from __future__ import annotations

TARGETS = {
    "bert": ["query", "key", "value", "dense"],
    "xlm-roberta": ["query", "value", "dense"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
"""The linear layers a tiny model's adapters target, by architecture (``embedrank.testing.tiny``)."""
TEXTS = [
    "a short one",
    "green tea lowers the risk of some cancers in a cohort followed for twenty years",
    "cats",
    "the river floods every spring and the town moves its market uphill",
    "lorem ipsum dolor",
]
