"""Image-text models (CLIP, SigLIP, SigLIP2) against sentence-transformers: architecture x tower x backend.

    python -m eval bench image-parity                       # every architecture and backend
    python -m eval bench image-parity --backends torch openvino --architectures clip

For each architecture it builds the tiny seeded model (:mod:`embedrank.testing.tiny_images`: text and vision
towers of 2 layers, hidden 64, the family's tokenizer and image processor), loads it with embedrank on each
backend (fp32) and with sentence-transformers on torch, and prints one Markdown table row per tower: the
largest absolute difference of the vectors over texts (a one-word one, Unicode, one cut at the window) and
drawn images of five sizes and aspect ratios. SigLIP texts are padded to the window on both sides, as the
model cards do. A cell is ``parity (<figure>)`` within 1e-5, ``not exported: <reason>`` when the backend
refuses the model (checked against torch at export), else ``FAIL``.

The exit status is 1 when any cell fails; a backend that refuses the model is a finding, not a failure.
Record it with ``make bench NAME=image-parity``; the supported-models page is rendered from the record.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

from embedrank import ImageTextEncoder  # noqa: E402
from embedrank.runtime.exports import ExportError  # noqa: E402
from embedrank.testing.tiny_images import DRAWN, IMAGE_TEXT_ARCHITECTURES, drawn_image, tiny_image_text  # noqa: E402

BACKENDS = ("torch", "openvino", "onnx")
BOUND = 1e-5
TEXTS = [
    *(caption for caption, _, _ in DRAWN),
    "x",
    "Ünïcödé: un carré rouge 季節",
    "a long caption " * 60,  # cut at the window
]


def images() -> list:
    return [
        drawn_image(shape, colour, seed=i, size=(96 - 12 * i, 40 + 11 * i))
        for i, (_, shape, colour) in enumerate(DRAWN[:5])
    ]


def reference(path: str, padded: bool, window: int) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(path, device="cpu")
    if padded:
        st[0].processing_kwargs = {"text": {"padding": "max_length", "max_length": window}}
    return st.encode(TEXTS), st.encode(images())


def cells(architecture: str, backend: str, expected: dict) -> dict[str, str]:
    """The text and image cells of one architecture on one backend."""
    path = tiny_image_text(architecture)
    try:
        model = ImageTextEncoder.from_pretrained(path, backend=backend)
    except ExportError as exc:
        return dict.fromkeys(("text", "image"), f"not exported: {exc.reason[:120]}")
    if architecture not in expected:
        expected[architecture] = reference(path, model.padded_to_window, model.max_seq_length)
    texts, pictures = expected[architecture]
    out = {}
    for tower, ours, theirs in (
        ("text", model.encode(TEXTS, batch_size=3), texts),
        ("image", model.encode_images(images(), batch_size=2), pictures),
    ):
        worst = float(np.abs(ours - theirs).max())
        out[tower] = f"parity ({worst:.1e})" if worst <= BOUND else f"FAIL ({worst:.1e})"
    return out


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--architectures", nargs="+", default=list(IMAGE_TEXT_ARCHITECTURES))
    args = parser.parse_args(argv)
    logging.getLogger("embedrank").setLevel(logging.ERROR)  # export notices; the table is the output
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    expected: dict = {}
    table = {(a, b): cells(a, b, expected) for a in args.architectures for b in args.backends}
    print("| architecture | public models of it | tower | " + " | ".join(f"{b}:fp32" for b in args.backends) + " |")
    print("|---|---|---|" + "---|" * len(args.backends))
    failed = False
    for architecture in args.architectures:
        examples = ", ".join(m.split("/")[-1] for m in IMAGE_TEXT_ARCHITECTURES[architecture].examples)
        for tower in ("text", "image"):
            row = [table[architecture, b][tower] for b in args.backends]
            failed |= any(cell.startswith("FAIL") for cell in row)
            print(f"| {architecture} | {examples} | {tower} | " + " | ".join(row) + " |")
    refused = sorted({a for (a, b), c in table.items() if c["text"].startswith("not exported")})
    held = sum(cell.startswith("parity") for c in table.values() for cell in c.values())
    print(
        f"\n{held} of {2 * len(table)} cells within {BOUND:g} of sentence-transformers"
        + (f"; not exported (run on torch): {', '.join(refused)}." if refused else ".")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run())
