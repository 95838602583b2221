"""Collections from their sources: the converters read small samples in each original format (written here),
fetch_beir reads an offline stand-in for the hub, and the missing-data message says what to do per name."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedrank.errors import DataNotFoundError
from embedrank.retrieval.data import load_beir, load_trec_run, resolve_dataset
from embedrank.retrieval.sources import convert_nfcorpus, convert_smart, convert_trec_dl, fetch_beir, read_smart

pytestmark = pytest.mark.kernel_free

CRAN_ALL = """.I 1
.T
experimental investigation of the aerodynamics of a
wing in a slipstream .
.A
brenckman,m.
.B
j. ae. scs. 25, 1958, 324.
.W
experimental investigation of the aerodynamics of a
wing in a slipstream .
  an experimental study of a wing in a propeller slipstream
.I 2
.T
simple shear flow past a flat plate .
.A
ting-yili
.B
department of aeronautical engineering.
.W
simple shear flow past a flat plate in an incompressible fluid .
.I 3
.T
the boundary layer
.A
.B
.W
"""
# query ids with gaps, as cran.qry has (001, 002, 004): the relevance file numbers them 1, 2, 3
CRAN_QRY = """.I 001
.W
what similarity laws must be obeyed when constructing aeroelastic models
of heated high speed aircraft .
.I 002
.W
what are the structural and aeroelastic problems associated with flight
.I 004
.W
heat conduction in composite slabs .
"""
CRANQREL = "1 1 2\n1 2 4\n2 2 1\n3 3 3\n3 1 -1\n"

MED_ALL = """.I 1
.W
correlation between maternal and fetal plasma levels of glucose and free fatty acids .
.I 2
.W
the crystalline lens in vertebrates .
"""
MED_QRY = """.I 1
.W
the crystalline lens in vertebrates, including humans.
"""
MED_REL = "1 0 2 1\n1 0 1 1\n"

ADI_ALL = """.I 1
.T
the ibm dsd technical information center
.A
robert a. kennedy
.W
the ibm data systems division technical information center
.I 2
.T
a computer system for thesauri
.W
a system for maintaining thesauri
"""
ADI_QRY = """.I 1
.W
What problems and concerns are there in making up descriptive titles?
"""
ADI_REL = " 1  2 0 0.000000\n 1  1 0 0.000000\n"


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_read_smart_keeps_fields_and_collapses_whitespace(tmp_path):
    records = read_smart(write(tmp_path / "cran", {"cran.all.1400": CRAN_ALL}) / "cran.all.1400")
    assert list(records) == ["1", "2", "3"]
    assert records["1"]["T"] == "experimental investigation of the aerodynamics of a wing in a slipstream ."
    assert records["1"]["W"].endswith("an experimental study of a wing in a propeller slipstream")
    assert records["3"]["W"] == "" and records["3"]["A"] == ""


def test_cranfield_renumbers_queries_and_grades_cleverdon_codes(tmp_path):
    src = write(tmp_path / "cran", {"cran.all.1400": CRAN_ALL, "cran.qry": CRAN_QRY, "cranqrel": CRANQREL})
    data = load_beir(convert_smart("cranfield", src, tmp_path / "cranfield"))
    assert data.corpus["2"] == {
        "title": "simple shear flow past a flat plate .",
        "text": "simple shear flow past a flat plate in an incompressible fluid .",
    }
    assert data.queries["3"] == "heat conduction in composite slabs ."  # cran.qry's .I 004 is relevance query 3
    assert data.qrels == {"1": {"1": 3, "2": 1}, "2": {"2": 4}, "3": {"3": 2}}  # 5 - code; -1 dropped
    assert "Counts: docs 3, queries 3, qrels 4" in (tmp_path / "cranfield" / "SOURCE.txt").read_text()


def test_medline_reads_trec_format_relevance(tmp_path):
    src = write(tmp_path / "med", {"MED.ALL": MED_ALL, "MED.QRY": MED_QRY, "MED.REL": MED_REL})
    data = load_beir(convert_smart("medline", src, tmp_path / "medline"))
    assert data.corpus["2"] == {"title": "", "text": "the crystalline lens in vertebrates ."}
    assert data.qrels == {"1": {"2": 1, "1": 1}}


def test_adi_reads_titles_and_binary_relevance(tmp_path):
    src = write(tmp_path / "adi", {"ADI.ALL": ADI_ALL, "ADI.QRY": ADI_QRY, "ADI.REL": ADI_REL})
    data = load_beir(convert_smart("adi", src, tmp_path / "adi-beir"))
    assert data.corpus["1"]["title"] == "the ibm dsd technical information center"
    assert data.corpus["1"]["text"] == "the ibm data systems division technical information center"
    assert data.qrels == {"1": {"2": 1, "1": 1}}


def test_nfcorpus_from_its_release(tmp_path):
    src = write(
        tmp_path / "nf",
        {
            "test.docs": "MED-10\tstatin breast cancer survival\nMED-14\tstatin use mortality\n",
            "dev.docs": "MED-20\tdietary fiber\nMED-10\tduplicate kept once\n",
            "test.2-1-0.qrel": "PLAIN-2 0 MED-10 2\nPLAIN-2 0 MED-20 1\nPLAIN-9 0 MED-14 2\nPLAIN-2 0 MED-99 1\n",
        },
    )
    queries = write(tmp_path / "q", {"topics.tsv": "PLAIN-2\tDo Cholesterol Statin Drugs Cause Breast Cancer?\n"})
    data = load_beir(convert_nfcorpus(src, queries / "topics.tsv", tmp_path / "nfcorpus"))
    assert data.corpus["MED-10"]["text"] == "statin breast cancer survival" and len(data.corpus) == 3
    assert data.qrels == {"PLAIN-2": {"MED-10": 2, "MED-20": 1}}  # unknown query and document dropped


def test_trec_dl_keeps_the_runs_top_passages_of_judged_queries(tmp_path):
    src = write(
        tmp_path / "dl",
        {
            "collection.tsv": "".join(f"{pid}\tpassage number {pid}\n" for pid in range(10)),
            "queries.tsv": "100\thow long is life cycle of flea\n200\tunjudged query\n",
            "qrels.txt": "100 0 3 3\n100 0 7 0\n100 0 999 2\n",
            "run.txt": "100 Q0 3 1 15.5 bm25\n100 Q0 5 2 14.0 bm25\n100 Q0 1 3 9.0 bm25\n200 Q0 2 1 3.0 bm25\n",
        },
    )
    root = convert_trec_dl(
        src / "collection.tsv", src / "queries.tsv", src / "qrels.txt", src / "run.txt", tmp_path / "dl19", depth=2
    )
    data = load_beir(root)
    assert set(data.corpus) == {"3", "5"} and list(data.queries) == ["100"]
    assert data.qrels == {"100": {"3": 3, "7": 0, "999": 2}}  # every judgment kept
    assert load_trec_run(root / "bm25_top100.run") == {"100": {"3": 15.5, "5": 14.0}}
    with pytest.raises(ValueError, match="not in"):
        (src / "collection.tsv").write_text("3\tonly one\n")
        convert_trec_dl(src / "collection.tsv", src / "queries.tsv", src / "qrels.txt", src / "run.txt", tmp_path / "x")


def test_fetch_beir_writes_every_qrels_split_from_the_hub_layout(tmp_path):
    hub = {
        ("BeIR/scifact", "corpus"): {
            "corpus": [{"_id": "4983", "title": "T", "text": "body"}, {"_id": "5", "title": None, "text": "b"}]
        },
        ("BeIR/scifact", "queries"): {"queries": [{"_id": "1", "text": "a claim"}]},
        ("BeIR/scifact-qrels", None): {
            "train": [{"query-id": 1, "corpus-id": 5, "score": 1}],
            "test": [{"query-id": 1, "corpus-id": 4983, "score": 1}],
        },
    }

    def load(repo, config=None):
        return hub[(repo, config)]

    root = fetch_beir("scifact", tmp_path, load=load)
    test = load_beir(root)
    assert test.corpus == {"4983": {"title": "T", "text": "body"}, "5": {"title": "", "text": "b"}}
    assert test.qrels == {"1": {"4983": 1}}
    assert load_beir(root, split="train").qrels == {"1": {"5": 1}}
    with pytest.raises(ValueError, match="not a BEIR collection"):
        fetch_beir("cranfield", tmp_path, load=load)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("scifact", "python eval/get_data.py fetch scifact"),
        (
            "cranfield",
            "BEIR does not host it; build it from its original files with: python eval/get_data.py convert cranfield",
        ),
        ("trec-dl19-passage-bm25top100", "convert trec-dl --collection"),
        ("my-collection", "Pass the collection directory's path"),
    ],
)
def test_the_missing_data_message_says_what_to_do_for_each_name(tmp_path, name, says):
    with pytest.raises(DataNotFoundError) as err:
        resolve_dataset(name, tmp_path)
    assert says in str(err.value)
    if name != "scifact":
        assert "ukp.informatik" not in str(err.value)  # no BEIR address for what BEIR does not host


def test_the_command_line_converts_and_lists(tmp_path, capsys):
    from eval import get_data

    src = write(tmp_path / "adi", {"ADI.ALL": ADI_ALL, "ADI.QRY": ADI_QRY, "ADI.REL": ADI_REL})
    assert get_data.main(["--data-dir", str(tmp_path / "data"), "convert", "adi", str(src)]) == 0
    out = capsys.readouterr().out
    assert "2 documents, 1 judged test queries, 2 judgments" in out
    assert get_data.main(["--data-dir", str(tmp_path / "data"), "list"]) == 0
    assert "holds: adi" in capsys.readouterr().out
    assert get_data.main(["--data-dir", str(tmp_path / "data"), "convert", "trec-dl"]) == 2
    assert "trec-dl needs --collection, --queries, --qrels, --run" in capsys.readouterr().err


def test_a_failed_fetch_says_where_else_to_get_the_collection(tmp_path, capsys, monkeypatch):
    from embedrank.retrieval import sources
    from eval import get_data

    def offline(name, data_dir, **_):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(sources, "fetch_beir", offline)
    assert get_data.main(["--data-dir", str(tmp_path), "fetch", "scifact"]) == 1
    err = capsys.readouterr().err
    assert "ConnectionError: Name or service not known" in err and "scifact.zip: unzip it into" in err
