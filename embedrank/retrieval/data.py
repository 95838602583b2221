"""BEIR-layout collections: loading, locating by name, and a tiny demo collection.

A collection directory holds ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``; some also
ship a first-stage run (``*.run``, TREC format). A document or a query may be an image: its row has an
``image`` field, the image's path relative to the collection folder (``{"_id": "d1", "image":
"images/d1.png", "text": "an optional caption"}``), which image-text models embed
(:mod:`embedrank.retrieval.images`). Files are read with the ``datasets`` library's local
json/csv loaders. Nothing here downloads anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

from embedrank.errors import DataNotFoundError
from embedrank.math.ranking import ranked_ids
from embedrank.paths import DATA_ENV, default_data_dir
from embedrank.types import Corpus, Qrels, Queries, Run

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"


@dataclasses.dataclass(frozen=True)
class BeirDataset:
    """A loaded collection. The dicts are fresh copies; nothing in embedrank mutates them."""

    name: str
    path: Path
    corpus: Corpus
    queries: Queries
    qrels: Qrels
    # documents and queries that are images (an ``image`` field: a path relative to the collection folder),
    # by id; their text, if any, is a caption that image-text retrieval does not read
    images: dict[str, Path] = dataclasses.field(default_factory=dict)
    query_images: dict[str, Path] = dataclasses.field(default_factory=dict)

    def doc_text(self, doc_id: str) -> str:
        return doc_text(self.corpus[doc_id])

    @property
    def first_stage_runs(self) -> list[Path]:
        """First-stage runs shipped with the collection (e.g. ``bm25_top100.run``)."""
        return sorted(self.path.glob("*.run"))


def doc_text(doc: dict[str, str]) -> str:
    """Document text as BEIR models see it: ``title + " " + text``, or just text without a title.

    >>> doc_text({"title": "T", "text": "body"})
    'T body'
    >>> doc_text({"title": "", "text": "body"})
    'body'
    """
    title = (doc.get("title") or "").strip()
    text = doc.get("text") or ""
    return f"{title} {text}" if title else text


# BEIR's public collections, by the name the BEIR paper and its download page give them
BEIR_COLLECTIONS = (
    "arguana",
    "climate-fever",
    "dbpedia-entity",
    "fever",
    "fiqa",
    "hotpotqa",
    "msmarco",
    "nfcorpus",
    "nq",
    "quora",
    "scidocs",
    "scifact",
    "trec-covid",
    "webis-touche2020",
)
# collections embedrank's commands know by name but BEIR does not host: how to build each
CONVERTED = {
    "cranfield": "python eval/get_data.py convert cranfield SOURCE_DIR (the Glasgow IR group's cran.all.1400, "
    "cran.qry, cranqrel)",
    "medline": "python eval/get_data.py convert medline SOURCE_DIR (the Glasgow IR group's MED.ALL, MED.QRY, MED.REL)",
    "adi": "python eval/get_data.py convert adi SOURCE_DIR (the Glasgow IR group's ADI.ALL, ADI.QRY, ADI.REL)",
    "nfcorpus-preprocessed-partial": "python eval/get_data.py convert nfcorpus SOURCE_DIR --queries QUERIES_TSV "
    "(NFCorpus's own release: test.docs, dev.docs, test.2-1-0.qrel)",
    "trec-dl19-passage-bm25top100": "python eval/get_data.py convert trec-dl --collection collection.tsv "
    "--queries msmarco-test2019-queries.tsv --qrels 2019qrels-pass.txt --run BM25_RUN",
}


def missing_data_message(name: str, data_dir: Path | None) -> str:
    """What to do when the collection ``name`` is not in ``data_dir``: fetch it (a BEIR collection), build it
    from its original files (a collection BEIR does not host), or give its path."""
    where = str(data_dir) if data_dir else f"a directory named by --data-dir or ${DATA_ENV}"
    found = f"dataset {name!r} not found in {where} (a collection is a directory with corpus.jsonl, queries.jsonl and qrels/test.tsv). "
    if name in BEIR_COLLECTIONS:
        how = (
            f"It is a BEIR collection: python eval/get_data.py fetch {name} downloads it there (online), or unzip "
            f"{BEIR_URL.format(name=name)} into {where}."
        )
    elif name in CONVERTED:
        how = f"BEIR does not host it; build it from its original files with: {CONVERTED[name]} (the data guide names the sources)."
    else:
        how = "Pass the collection directory's path instead of a name, or put the collection there."
    return found + how


def resolve_dataset(name_or_path: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Find a collection directory from a path or a name inside ``data_dir`` (default: :func:`default_data_dir`).

    Raises:
        DataNotFoundError: with a message that says where BEIR hosts the zip and where to unpack it.
    """
    candidate = Path(name_or_path).expanduser()
    if (candidate / "corpus.jsonl").is_file():
        return candidate
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if root is not None and (root / str(name_or_path) / "corpus.jsonl").is_file():
        return root / str(name_or_path)
    raise DataNotFoundError(missing_data_message(str(name_or_path), root))


def _read_jsonl(path: Path) -> list[dict]:
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("json", data_files=str(path), split="train", keep_in_memory=True)
    return ds.to_list()


def load_beir(path: str | os.PathLike[str], split: str = "test", *, data_dir: str | None = None) -> BeirDataset:
    """Load a BEIR-layout collection. Queries are restricted to those judged in ``split``.

    Returns a :class:`BeirDataset` with ``corpus``, ``queries`` and ``qrels`` dicts.
    """
    import datasets

    root = resolve_dataset(path, data_dir)
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        raise DataNotFoundError(
            f"{root} has no qrels/{split}.tsv (splits present: "
            f"{sorted(p.stem for p in (root / 'qrels').glob('*.tsv'))})"
        )
    documents, query_rows = _read_jsonl(root / "corpus.jsonl"), _read_jsonl(root / "queries.jsonl")
    corpus: Corpus = {
        str(row["_id"]): {"title": row.get("title") or "", "text": row.get("text") or ""} for row in documents
    }
    all_queries = {str(row["_id"]): row.get("text") or "" for row in query_rows}
    datasets.disable_progress_bars()
    qrels_rows = datasets.load_dataset(
        "csv",
        data_files=str(qrels_path),
        delimiter="\t",
        split="train",
        keep_in_memory=True,
        features=datasets.Features(
            {
                "query-id": datasets.Value("string"),
                "corpus-id": datasets.Value("string"),
                "score": datasets.Value("int64"),
            }
        ),
    )
    qrels: Qrels = {}
    for row in qrels_rows:
        qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    queries = {qid: text for qid, text in all_queries.items() if qid in qrels}
    images = _images(root, documents, "corpus.jsonl")
    query_images = {qid: path for qid, path in _images(root, query_rows, "queries.jsonl").items() if qid in queries}
    return BeirDataset(
        name=root.name, path=root, corpus=corpus, queries=queries, qrels=qrels, images=images, query_images=query_images
    )


def _images(root: Path, rows: list[dict], where: str) -> dict[str, Path]:
    """The rows of ``where`` that are images: their ``image`` field, a path relative to ``root``, by id.

    Raises:
        DataNotFoundError: a row names an image file that is not there.
    """
    found = {str(row["_id"]): root / str(row["image"]) for row in rows if row.get("image")}
    missing = next((path for path in found.values() if not path.is_file()), None)
    if missing is not None:
        raise DataNotFoundError(f"{where} names the image {missing}, which is not there")
    return found


def load_trec_run(path: str | os.PathLike[str]) -> Run:
    """Read a TREC run file (``qid Q0 docid rank score tag``)."""
    run: Run = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5:
                run.setdefault(parts[0], {})[parts[2]] = float(parts[4])
    return run


def write_trec_run(run: Run, path: str | os.PathLike[str], tag: str = "embedrank") -> None:
    """Write a TREC run file; ranks follow trec_eval's order (score descending, ties by doc id descending)."""
    with open(path, "w", encoding="utf-8") as f:
        for qid in sorted(run):
            for rank, doc_id in enumerate(ranked_ids(run[qid]), start=1):
                f.write(f"{qid} Q0 {doc_id} {rank} {run[qid][doc_id]:.6f} {tag}\n")


DEMO_CORPUS: Corpus = {
    "d1": {
        "title": "Photosynthesis",
        "text": "Plants convert sunlight, water and carbon dioxide into glucose and oxygen.",
    },
    "d2": {"title": "Seasons", "text": "Earth's seasons are caused by the tilt of its axis relative to its orbit."},
    "d3": {"title": "Tides", "text": "Ocean tides result mainly from the gravitational pull of the Moon."},
    "d4": {
        "title": "Vaccines",
        "text": "Vaccines train the immune system to recognise a pathogen without causing disease.",
    },
    "d5": {
        "title": "Antibiotics",
        "text": "Antibiotics kill bacteria but have no effect on viruses such as influenza.",
    },
    "d6": {"title": "Plate tectonics", "text": "Earthquakes occur where tectonic plates grind against each other."},
    "d7": {"title": "Black holes", "text": "A black hole's gravity is so strong that not even light escapes it."},
    "d8": {"title": "DNA", "text": "DNA carries genetic instructions as sequences of four nucleotide bases."},
    "d9": {"title": "Rainbows", "text": "Rainbows appear when sunlight is refracted and reflected inside raindrops."},
    "d10": {"title": "Sound", "text": "Sound travels as a pressure wave and cannot propagate through a vacuum."},
    "d11": {"title": "Insulin", "text": "Insulin is a hormone that lets cells absorb glucose from the blood."},
    "d12": {"title": "Volcanoes", "text": "Volcanoes erupt when magma from the mantle rises through the crust."},
}
DEMO_QUERIES: Queries = {
    "q1": "why do we have summer and winter",
    "q2": "what makes the sea rise and fall each day",
    "q3": "do antibiotics work against the flu",
    "q4": "how do plants make their food",
    "q5": "what causes earthquakes",
    "q6": "how does the body control blood sugar",
}
DEMO_QRELS: Qrels = {
    "q1": {"d2": 1},
    "q2": {"d3": 1},
    "q3": {"d5": 2, "d4": 1},
    "q4": {"d1": 1},
    "q5": {"d6": 1},
    "q6": {"d11": 1},
}


def write_beir(
    root: str | os.PathLike[str],
    corpus: Corpus,
    queries: Queries,
    qrels: Mapping[str, Qrels],
    *,
    source: str = "",
) -> Path:
    """Write a collection in BEIR layout at ``root``: ``corpus.jsonl`` (``_id``, ``title``, ``text``),
    ``queries.jsonl`` (``_id``, ``text``), ``qrels/<split>.tsv`` for each split of ``qrels`` (split name ->
    judgments) and, with ``source``, ``SOURCE.txt``. Returns ``root``."""
    root = Path(root)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for doc_id, doc in corpus.items():
            row = {"_id": doc_id, "title": doc.get("title", ""), "text": doc.get("text", "")}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    for split, judged in qrels.items():
        with open(root / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for qid, rels in judged.items():
                for doc_id, rel in rels.items():
                    f.write(f"{qid}\t{doc_id}\t{rel}\n")
    if source:
        (root / "SOURCE.txt").write_text(source.rstrip() + "\n", encoding="utf-8")
    return root


def judged_sample(dataset: BeirDataset, n_docs: int, *, n_queries: int | None = None, seed: int = 0) -> BeirDataset:
    """A smaller collection with the same judgments: the first ``n_queries`` queries (all by default), every
    document judged for them, and seeded unjudged documents up to ``n_docs`` in all, in corpus order.

    Every judged document stays, so for a fixed model each query's nDCG@k and recall@k on the sample are at
    least those on the whole collection (only unjudged documents leave the ranking); the sample is for
    quick experiments and tests, not for figures to compare with published ones. The same ``dataset``,
    sizes and ``seed`` give the same sample. Its ``path`` is the source's; :func:`write_beir` writes it out.

    Raises:
        ValueError: if the queries' judged documents alone number more than ``n_docs``.
    """
    import numpy as np

    queries = dict(list(dataset.queries.items())[:n_queries])
    qrels = {q: dict(dataset.qrels[q]) for q in queries if q in dataset.qrels}
    judged = {d for rels in qrels.values() for d in rels if d in dataset.corpus}
    if len(judged) > n_docs:
        raise ValueError(f"{len(queries)} queries judge {len(judged)} documents, more than n_docs={n_docs}")
    others = [d for d in dataset.corpus if d not in judged]
    picked = np.random.default_rng(seed).choice(len(others), min(n_docs - len(judged), len(others)), replace=False)
    keep = judged | {others[i] for i in picked}
    corpus = {d: dict(doc) for d, doc in dataset.corpus.items() if d in keep}
    return BeirDataset(name=dataset.name, path=dataset.path, corpus=corpus, queries=queries, qrels=qrels)


def write_demo_collection(directory: str | os.PathLike[str]) -> Path:
    """Write the built-in demo collection in BEIR layout under ``directory/demo`` and return its path."""
    return write_beir(
        Path(directory) / "demo",
        DEMO_CORPUS,
        DEMO_QUERIES,
        {"test": DEMO_QRELS},
        source="Written by embedrank.retrieval.data.write_demo_collection; hand-made, public domain.",
    )
