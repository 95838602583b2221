#!/usr/bin/env python
"""Builds the sample of real texts shipped with the package (``embedrank/sample/texts.jsonl``): the default
int8 calibration, ``auto``'s quality and speed measurement and the int8/uint8 embedding ranges
(:func:`embedrank.texts.packaged_sample`). Kept so the file can be made again and checked; the package
reads only its output.

Sources, all with licences that allow redistribution (notices in ``embedrank/sample/NOTICE.md``):

- ``passage``: prose of the Python 3.11 documentation's library reference, tutorial and HOWTOs, consecutive
  paragraphs of a page joined into passages of 100 to 300 words, as a document is chunked (Debian's ``python3.11-doc`` package, its reStructuredText sources; PSF License);
- ``passage``: prose paragraphs of scikit-learn's dataset descriptions (the installed ``scikit-learn``,
  ``sklearn/datasets/descr``; BSD-3-Clause);
- ``question``: the questions of the Python FAQ (section titles ending in ``?``; PSF License);
- ``definition`` and ``example``: WordNet 3.0 glosses and their quoted example sentences, nouns, verbs,
  adjectives and adverbs (Debian's ``wordnet-base``; WordNet 3.0 License).

Markup is stripped (roles, literals, emphasis, links); code, tables and directives are left out. Picks are
seeded and the rows are shuffled (seeded), so any prefix mixes the kinds.

    python eval/build_sample.py            # fetches the two Debian packages with apt-get download
    python eval/build_sample.py --debian DIR   # DIR holds python3.11-doc and wordnet-base, extracted
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import subprocess
import tempfile
from pathlib import Path

COUNTS = {"python-docs": 220, "scikit-learn": 20, "python-faq": 150, "wordnet-gloss": 220, "wordnet-example": 190}
PACKAGES = ("python3.11-doc", "wordnet-base")
OUT = Path(__file__).resolve().parents[1] / "embedrank" / "sample" / "texts.jsonl"

_ROLE = re.compile(r":[a-z:+-]+:`(?:~|!)?([^`<]+?)(?:\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)(?:\s*<[^>]*>)?`__?")
_LITERAL = re.compile(r"``([^`]+)``")
_EMPHASIS = re.compile(r"\*\*?([^*]+)\*\*?")
_HEADING = re.compile(r"^([=\-~^\"'`#*+.]){3,}\s*$")


def plain(text: str) -> str:
    """reStructuredText inline markup -> plain text."""
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    return re.sub(r"\s+", " ", text).replace("\\", "").strip()


def rst_paragraphs(source: str) -> list[str]:
    """The unindented prose paragraphs of a reStructuredText file, markup stripped."""
    paragraphs, block = [], []
    for line in [*source.splitlines(), ""]:
        if line.strip() and not line[0].isspace():
            block.append(line)
            continue
        if block:
            paragraphs.append(block)
        block = []
    prose = []
    for lines in paragraphs:
        first = lines[0]
        if first.startswith(("..", ">>>", "|", "+", "=", "-", "*", "#", ":")) or any(_HEADING.match(x) for x in lines):
            continue
        text = plain(" ".join(lines))
        if text.endswith("::") or "`" in text or "|" in text or not text.endswith("."):
            continue
        prose.append(text)
    return prose


def chunks(paragraphs: list[str], least: int, most: int) -> list[str]:
    """Consecutive paragraphs joined until they hold ``least`` words; kept when they hold at most ``most``."""
    out, held = [], []
    for paragraph in paragraphs:
        held.append(paragraph)
        words = sum(len(p.split()) for p in held)
        if words >= least:
            if words <= most:
                out.append(" ".join(held))
            held = []
    return out


def rst_questions(source: str) -> list[str]:
    """Section titles that are questions (a title line followed by its underline)."""
    lines = source.splitlines()
    return [
        plain(title)
        for title, under in itertools.pairwise(lines)
        if title.strip().endswith("?") and _HEADING.match(under) and len(under.strip()) >= len(title.strip())
    ]


def wordnet_glosses(folder: Path) -> tuple[list[str], list[str]]:
    """(definitions, example sentences) of every synset's gloss, in WordNet's data files."""
    definitions, examples = [], []
    for part in ("noun", "verb", "adj", "adv"):
        for line in (folder / f"data.{part}").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  ") or " | " not in line:  # the licence header
                continue
            gloss = line.split(" | ", 1)[1].strip()
            pieces = [p.strip() for p in gloss.split(";")]
            definition = pieces[0]
            if len(definition.split()) >= 6 and '"' not in definition:
                definitions.append(definition[0].upper() + definition[1:] + ".")
            for p in pieces[1:]:
                if p.startswith('"') and p.endswith('"') and len(p.split()) >= 5:
                    sentence = p.strip('"').strip()
                    examples.append(sentence[0].upper() + sentence[1:] + ("" if sentence[-1] in ".?!" else "."))
    return definitions, examples


def fetch_debian(into: Path) -> Path:
    """Downloads and extracts :data:`PACKAGES` with apt-get (no install)."""
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=into, check=True)
    for deb in into.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(into / "root")], check=True)
    return into / "root"


def sources(root: Path) -> dict[str, list[str]]:
    import sklearn

    docs = root / "usr/share/doc/python3.11/html/_sources"
    passages = []
    for folder in ("library", "tutorial", "howto"):
        for file in sorted((docs / folder).glob("*.rst.txt")):
            passages += chunks(rst_paragraphs(file.read_text(encoding="utf-8")), 100, 300)
    questions = []
    for file in sorted((docs / "faq").glob("*.rst.txt")):
        questions += rst_questions(file.read_text(encoding="utf-8"))
    descr = Path(sklearn.__file__).parent / "datasets" / "descr"
    science = []
    for file in sorted(descr.glob("*.rst")):
        science += [p for p in rst_paragraphs(file.read_text(encoding="utf-8")) if 25 <= len(p.split()) <= 220]
    definitions, examples = wordnet_glosses(root / "usr/share/wordnet")
    return {
        "python-docs": passages,
        "scikit-learn": science,
        "python-faq": questions,
        "wordnet-gloss": definitions,
        "wordnet-example": examples,
    }


KINDS = {
    "python-docs": "passage",
    "scikit-learn": "passage",
    "python-faq": "question",
    "wordnet-gloss": "definition",
    "wordnet-example": "example",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debian", type=Path, help="folder the Debian packages are extracted in (default: fetch them)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        found = sources(args.debian or fetch_debian(Path(tmp)))
    rng = random.Random(0)
    rows = []
    for source, n in COUNTS.items():
        unique = sorted(set(found[source]))
        if len(unique) < n:
            raise SystemExit(f"{source}: {len(unique)} texts, {n} wanted")
        rows += [{"text": t, "kind": KINDS[source], "source": source} for t in rng.sample(unique, n)]
    rng.shuffle(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    size = args.out.stat().st_size
    print(f"{len(rows)} texts, {size / 1024:.0f} KiB -> {args.out}")
    for source in COUNTS:
        lengths = sorted(len(r["text"].split()) for r in rows if r["source"] == source)
        print(
            f"  {source}: {len(lengths)} texts, {lengths[0]}-{lengths[-1]} words (median {lengths[len(lengths) // 2]})"
        )


if __name__ == "__main__":
    main()
