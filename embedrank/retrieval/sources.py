"""Where collections come from: BEIR collections fetched by name, and the converters that build the BEIR
layout from the original files of collections BEIR does not host.

:func:`fetch_beir` downloads a BEIR collection from the Hugging Face hub (``BeIR/<name>`` and
``BeIR/<name>-qrels``, with the ``datasets`` library's progress bars) and writes it in BEIR layout; it needs
the network. The converters read files you downloaded yourself and need nothing else:

- :func:`convert_smart`: the Glasgow IR group's SMART-format collections (Cranfield, MEDLINE, ADI):
  ``.I`` records with ``.T`` (title), ``.A``, ``.B`` and ``.W`` (text) fields, and their relevance files.
- :func:`convert_nfcorpus`: NFCorpus's own release (``<split>.docs``, the test queries, ``<split>.2-1-0.qrel``).
- :func:`convert_trec_dl`: a TREC Deep Learning passage set reranking a first-stage run: the MS MARCO
  passage collection (``collection.tsv``), the year's queries and qrels, and a TREC run; the corpus is the
  run's top-``depth`` passages of the judged queries.

``python eval/get_data.py`` is the command line for all of them.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from embedrank.retrieval.data import BEIR_COLLECTIONS, load_trec_run, write_beir, write_trec_run
from embedrank.types import Corpus, Qrels, Queries, Run


def _hub_rows(load: Callable, repo: str, config: str) -> Iterator[dict]:
    """The rows of the one split BEIR's hub datasets give a config (``corpus``, ``queries``), named as it."""
    yield from load(repo, config)[config]


def fetch_beir(name: str, data_dir: str | os.PathLike[str], *, load: Callable | None = None) -> Path:
    """Download the BEIR collection ``name`` from the Hugging Face hub into ``data_dir/name`` (BEIR layout,
    every qrels split the hub has) and return that directory.

    ``load`` is :func:`datasets.load_dataset` unless given (the tests pass an offline stand-in).

    Raises:
        ValueError: ``name`` is not one of :data:`BEIR_COLLECTIONS`.
    """
    if name not in BEIR_COLLECTIONS:
        raise ValueError(f"{name!r} is not a BEIR collection; BEIR's are {', '.join(BEIR_COLLECTIONS)}")
    if load is None:
        import datasets

        load = datasets.load_dataset
    repo = f"BeIR/{name}"
    corpus: Corpus = {
        str(row["_id"]): {"title": row.get("title") or "", "text": row.get("text") or ""}
        for row in _hub_rows(load, repo, "corpus")
    }
    queries: Queries = {str(row["_id"]): row["text"] for row in _hub_rows(load, repo, "queries")}
    hub_qrels = load(f"{repo}-qrels")
    qrels: dict[str, Qrels] = {}
    for split in hub_qrels:
        for row in hub_qrels[split]:
            qrels.setdefault(split, {}).setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(row["score"])
    counts = ", ".join(f"{split} {sum(map(len, judged.values()))}" for split, judged in qrels.items())
    source = (
        f"BEIR {name}, fetched from the Hugging Face hub ({repo}, {repo}-qrels) by embedrank's fetch_beir.\n"
        f"Counts: docs {len(corpus)}, queries {len(queries)}, qrels {counts}."
    )
    return write_beir(Path(data_dir) / name, corpus, queries, qrels, source=source)


def read_smart(path: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """The records of a SMART-format file: ``.I <id>`` starts a record, ``.<letter>`` a field whose text
    runs to the next marker. Returns ``{id: {letter: text}}`` in file order, the text's whitespace collapsed.

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "x.all"
    >>> _ = f.write_text(".I 1\\n.T\\nA title\\n.W\\nsome\\n  text\\n.I 2\\n.W\\nmore\\n")
    >>> read_smart(f)
    {'1': {'T': 'A title', 'W': 'some text'}, '2': {'W': 'more'}}
    """
    records: dict[str, dict[str, list[str]]] = {}
    field = None
    current: dict[str, list[str]] | None = None
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        marker = re.match(r"^\.([A-Z])(?:\s+(\S+))?\s*$", line)
        if marker and marker[1] == "I":
            current = records.setdefault(marker[2] or str(len(records) + 1), {})
            field = None
        elif marker:
            field = marker[1]
            if current is not None:
                current.setdefault(field, [])
        elif current is not None and field is not None:
            current[field].append(line)
    return {rid: {k: " ".join(" ".join(v).split()) for k, v in fields.items()} for rid, fields in records.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SmartLayout:
    """How one SMART collection's files read: their names, and how its relevance file is laid out."""

    documents: str
    queries: str
    relevance: str
    relevance_columns: tuple[int, int, int | None]  # query id, document id, grade (None: every line is 1)
    renumber_queries: bool = False  # the relevance file numbers queries 1..n in file order (Cranfield)
    cleverdon: bool = False  # grades are Cleverdon's codes: 1 (complete answer) .. 4 (minimum interest), -1 none


SMART_COLLECTIONS = {
    # cranqrel: "qid docid code", Cleverdon's codes 1 (complete answer) .. 4 (minimum interest), -1: no judgment
    "cranfield": SmartLayout(
        documents="cran.all.1400",
        queries="cran.qry",
        relevance="cranqrel",
        relevance_columns=(0, 1, 2),
        renumber_queries=True,
        cleverdon=True,
    ),
    # MED.REL (the 2000 release) is in TREC format: "qid 0 docid 1"
    "medline": SmartLayout(documents="MED.ALL", queries="MED.QRY", relevance="MED.REL", relevance_columns=(0, 2, 3)),
    # ADI.REL: "qid docid ..." (binary)
    "adi": SmartLayout(documents="ADI.ALL", queries="ADI.QRY", relevance="ADI.REL", relevance_columns=(0, 1, None)),
}


def convert_smart(name: str, source_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Build ``out_dir`` in BEIR layout from the Glasgow files of ``name`` (cranfield, medline or adi) in
    ``source_dir``: title ``.T``, text ``.W``, queries' text ``.W``, qrels as :data:`SMART_COLLECTIONS`
    describes. Returns ``out_dir``."""
    layout = SMART_COLLECTIONS[name]
    src = Path(source_dir)
    documents = read_smart(src / layout.documents)
    corpus: Corpus = {doc_id: {"title": f.get("T", ""), "text": f.get("W", "")} for doc_id, f in documents.items()}
    raw_queries = read_smart(src / layout.queries)
    if layout.renumber_queries:
        raw_queries = {str(n): f for n, f in enumerate(raw_queries.values(), start=1)}
    else:
        raw_queries = {str(int(q)) if q.isdigit() else q: f for q, f in raw_queries.items()}
    queries: Queries = {qid: f.get("W", "") for qid, f in raw_queries.items()}
    qrels: Qrels = {}
    qcol, dcol, gcol = layout.relevance_columns
    for line in (src / layout.relevance).read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) <= max(c for c in (qcol, dcol, gcol) if c is not None):
            continue
        grade = int(float(parts[gcol])) if gcol is not None else 1
        if layout.cleverdon:  # 4 best .. 1 weakest; -1 marks a query without judgments
            if not 1 <= grade <= 4:
                continue
            grade = 5 - grade
        qid, doc_id = str(int(parts[qcol])), str(int(parts[dcol]))
        if qid in queries and doc_id in corpus:
            qrels.setdefault(qid, {})[doc_id] = grade
    source = (
        f"{name}, converted by embedrank's convert_smart from the Glasgow IR group's files "
        f"({layout.documents}, {layout.queries}, {layout.relevance}).\n"
        f"Counts: docs {len(corpus)}, queries {len(queries)}, qrels {sum(map(len, qrels.values()))}."
    )
    return write_beir(out_dir, corpus, queries, {"test": qrels}, source=source)


def _tsv(path: Path) -> Iterator[list[str]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield line.rstrip("\n").split("\t")


def convert_nfcorpus(
    source_dir: str | os.PathLike[str],
    queries_tsv: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    splits: tuple[str, ...] = ("test", "dev"),
) -> Path:
    """Build NFCorpus's test set in BEIR layout from its own release in ``source_dir`` (the ``<split>.docs``
    files of ``splits``, ``id<TAB>text``, and ``test.2-1-0.qrel``, ``qid 0 docid grade``) and a tab-separated
    file of the test queries (``id<TAB>text``, BEIR's query texts). Returns ``out_dir``."""
    src = Path(source_dir)
    corpus: Corpus = {}
    for split in splits:
        for doc_id, text, *_ in _tsv(src / f"{split}.docs"):
            corpus.setdefault(doc_id, {"title": "", "text": text})
    queries: Queries = {qid: text for qid, text, *_ in _tsv(Path(queries_tsv))}
    qrels: Qrels = {}
    for line in (src / "test.2-1-0.qrel").read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] in queries and parts[2] in corpus:
            qrels.setdefault(parts[0], {})[parts[2]] = int(parts[3])
    source = (
        f"NFCorpus test set, converted by embedrank's convert_nfcorpus from the original release "
        f"({', '.join(f'{s}.docs' for s in splits)}, test.2-1-0.qrel) and the test queries.\n"
        f"Counts: docs {len(corpus)}, queries {len(queries)}, qrels {sum(map(len, qrels.values()))}."
    )
    return write_beir(out_dir, corpus, queries, {"test": qrels}, source=source)


def convert_trec_dl(
    collection_tsv: str | os.PathLike[str],
    queries_tsv: str | os.PathLike[str],
    qrels_path: str | os.PathLike[str],
    run_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    depth: int = 100,
    run_name: str = "bm25_top100.run",
) -> Path:
    """Build a TREC Deep Learning passage reranking set in BEIR layout: the judged queries of ``qrels_path``
    (TREC qrels, graded 0-3), their text from ``queries_tsv`` (``qid<TAB>text``), the top ``depth`` passages
    of each in the TREC run ``run_path`` as the corpus (read from MS MARCO's ``collection.tsv``,
    ``pid<TAB>text``, streamed: the 8.8M passages are never all in memory), and that run, cut at ``depth``,
    as ``<out_dir>/<run_name>``. Every judgment of those queries is kept. Returns ``out_dir``."""
    qrels: Qrels = {}
    for line in Path(qrels_path).read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 4:
            qrels.setdefault(parts[0], {})[parts[2]] = int(parts[3])
    queries: Queries = {qid: text for qid, text, *_ in _tsv(Path(queries_tsv)) if qid in qrels}
    full: Run = load_trec_run(run_path)
    run: Run = {}
    for qid in queries:
        ranked = sorted(full.get(qid, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
        run[qid] = dict(ranked)
    wanted = {pid for docs in run.values() for pid in docs}
    corpus: Corpus = {}
    for pid, text, *_ in _tsv(Path(collection_tsv)):
        if pid in wanted:
            corpus[pid] = {"title": "", "text": text}
    missing = wanted - set(corpus)
    if missing:
        raise ValueError(f"{len(missing)} passages of the run are not in {collection_tsv} (e.g. {sorted(missing)[0]})")
    source = (
        f"TREC DL passage reranking set, converted by embedrank's convert_trec_dl: judged queries of "
        f"{Path(qrels_path).name}, the top {depth} of {Path(run_path).name} per query, passages from "
        f"{Path(collection_tsv).name}.\nCounts: docs {len(corpus)}, queries {len(queries)}, "
        f"qrels {sum(map(len, qrels.values()))}."
    )
    root = write_beir(out_dir, corpus, queries, {"test": {q: qrels[q] for q in queries}}, source=source)
    write_trec_run(run, root / run_name, tag=Path(run_path).stem)
    return root
