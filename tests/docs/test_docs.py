"""The documentation: the README is a front page, the manual builds strictly, every code example runs (the
Python blocks in order, one namespace per page; the HTTP examples' requests against the service), the
benchmarks page is what the recorded results render to, and no user page tells how the work was organized."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from eval.harness import render

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
USER_PAGES = [README, REPO / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
EXAMPLE_PAGES = [p for p in USER_PAGES if "```python" in p.read_text(encoding="utf-8")]


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.mark.kernel_free
def test_readme_is_a_front_page_whose_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (REPO / target).is_file(), target


HISTORY = re.compile(
    r"\b(issue|session|round|step) ?#?\d+|\bsessions?\b|\btried (and|then)\b|\bwhat changed\b|"
    r"\btried and dropped\b|\bbefore,|\bshared/SPEC|(?-i:\bSPEC\b)",
    re.I,
)


@pytest.mark.kernel_free
@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_user_pages_speak_of_the_product_only(page):
    # prose only: a benchmark's recorded output may count its own rounds
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    found = [m.group(0) for m in HISTORY.finditer(text)]
    assert not found, f"{page.relative_to(REPO)} tells how the work was organized: {found}"


@pytest.mark.kernel_free
def test_benchmarks_page_is_rendered_from_the_result_files():
    assert (DOCS / "benchmarks.md").read_text(encoding="utf-8") == render.render(render.load_results()), (
        "docs/benchmarks.md was edited by hand or is stale: run python -m eval render"
    )
    assert (DOCS / "benchmark-records.md").read_text(encoding="utf-8") == render.render_records(
        render.load_results()
    ), "docs/benchmark-records.md was edited by hand or is stale: run python -m eval render"
    assert (DOCS / "models.md").read_text(encoding="utf-8") == render.render_models(render.load_results()), (
        "docs/models.md was edited by hand or is stale: run python -m eval render"
    )
    assert render.SUITE_PART.read_text(encoding="utf-8") == render.render_suite(render.load_results()), (
        "eval/results/suite.md (the testing guide's durations) is stale: run python -m eval render"
    )
    for result in render.load_results():
        assert result["command"] and result["date"] and result["machine"]["cpu"] and result["output"].strip()


@pytest.mark.kernel_free
@pytest.mark.slow
def test_the_manual_builds_strictly(tmp_path):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    build(config)  # strict: a broken link, anchor or reference aborts
    assert (tmp_path / "site" / "reference" / "models" / "index.html").is_file()
    for page in (tmp_path / "site" / "reference").rglob("*.html"):  # docstrings' Sphinx roles: links or code
        raw = re.findall(r":(?:class|func|meth|mod|data|attr|exc):`", page.read_text(encoding="utf-8"))
        assert not raw, (page, len(raw))


def _curl_requests(page: Path) -> list[tuple[str, dict]]:
    """The (path, JSON body) of every curl call in a page's bash blocks."""
    found = []
    for block in _blocks(page, "bash"):
        for command in block.replace("\\\n", " ").splitlines():
            if "curl" not in command:
                continue
            words = shlex.split(command[command.index("curl") :].split("&")[0], comments=True)
            if "-d" not in words:  # a GET, such as the wait for /health
                continue
            url = next(w for w in words if "localhost" in w)
            body = words[words.index("-d") + 1]
            found.append((url.split("localhost:8000", 1)[1], json.loads(body)))
    return found


HTTP_PAGES = [p for p in USER_PAGES if _curl_requests(p)]


@pytest.mark.parametrize("page", HTTP_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_http_examples_are_answered(page, fake_service):
    from embedrank.models.colbert import ColBERTEncoder
    from embedrank.models.m3 import M3Encoder
    from embedrank.registry import DEFAULT_EMBEDDING_MODEL
    from embedrank.testing.fake import FakeEncoder, FakeSparseEncoder, fake_model
    from embedrank.testing.tiny import tiny_bge_m3, tiny_colbert
    from service.settings import Auth, Engine, ModelEntry, Models, Settings

    models = {DEFAULT_EMBEDDING_MODEL: FakeEncoder(DEFAULT_EMBEDDING_MODEL), "splade": FakeSparseEncoder("splade")}
    models["tasks"] = fake_model("tasks", "fake:encoder-with-adapters")  # jina-embeddings-v3's task adapters
    models["reranker"] = fake_model("reranker", "fake:cross-encoder-with-adapters")  # its adapter "support"
    models["bge-m3"] = M3Encoder.from_pretrained(tiny_bge_m3(), backend="torch")  # a tiny one in bge-m3's layout
    models["colbert"] = ColBERTEncoder.from_pretrained(tiny_colbert(), backend="torch")  # in PyLate's layout
    settings = Settings(
        auth=Auth(api_keys=("secret",)),
        models=Models(entries=(ModelEntry(id=DEFAULT_EMBEDDING_MODEL),)),
        engine=Engine(tune_malloc=False),
    )
    with fake_service(models, key="secret", settings=settings) as client:
        for path, body in _curl_requests(page):
            response = client.post(path, json=body)
            assert response.status_code == 200, (path, body, response.text)


def _reads_collections(page: Path) -> bool:
    """Whether a page's Python examples read the benchmark collections (they name SciFact)."""
    return any(re.search(r"scifact|nfcorpus|load_beir", block, re.I) for block in _blocks(page, "python"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, marks=[pytest.mark.data] if _reads_collections(p) else [], id=str(p.relative_to(REPO)))
        for p in EXAMPLE_PAGES
    ],
)
def test_python_examples_run(page, request, cross_encoder_dir, monkeypatch, tmp_path, capsys):
    if _reads_collections(page):  # SciFact is its judged sample, whose vectors are in the embedding cache
        request.getfixturevalue("scifact_sample_dense")
        monkeypatch.setenv("EMBEDRANK_DATA", str(request.getfixturevalue("sample_data_dir")))
    # offline, the hub id the examples name is a seeded model of the same layout in a hub cache of the test's
    _cache_as_hub_model(tmp_path / "hub", "cross-encoder/ms-marco-MiniLM-L6-v2", Path(cross_encoder_dir), monkeypatch)
    from embedrank.testing.tiny_images import tiny_image_text

    _cache_as_hub_model(tmp_path / "hub", "openai/clip-vit-base-patch32", Path(tiny_image_text("clip")), monkeypatch)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_example"}
    for number, block in enumerate(_blocks(page, "python"), start=1):
        exec(compile(block, f"{page.relative_to(REPO)} python block {number}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.strip()
    if page.name == "retrieval.md":
        assert "embedding cache: hit (" in printed and "'ndcg@10'" in printed


def _cache_as_hub_model(cache: Path, model_id: str, folder: Path, monkeypatch) -> None:
    """Lay ``folder`` out in a Hugging Face hub cache at ``cache`` as the snapshot of ``model_id``, and point
    huggingface_hub at that cache, so the example's hub id loads offline as a cached model does."""
    import huggingface_hub.constants

    revision = "0" * 40
    repo = cache / f"models--{model_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for path in folder.rglob("*"):
        if path.is_file():
            target = snapshot / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))


def _script_commands(script: str) -> list[tuple[Path, list[str]]]:
    """Every ``python eval/<script>`` command in the user pages' bash blocks: (page, its arguments)."""
    found = []
    for page in USER_PAGES:
        for block in _blocks(page, "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words[:2] == ["python", f"eval/{script}"]:
                    found.append((page, words[2:]))
    return found


@pytest.mark.kernel_free
def test_documented_harness_commands_parse():
    """The eval/run.py and eval/train.py commands the manual shows are accepted as written (parsed, not run)."""
    from eval import run, train

    commands = _script_commands("run.py")
    assert len(commands) >= 10
    for page, argv in commands:
        try:
            args = run.build_parser().parse_args(argv)
        except SystemExit as exc:  # argparse exits 0 for --help, 2 for a bad option
            assert exc.code == 0 and "--help" in argv, (page.name, argv)
            continue
        if not args.compare:  # the systems it names for the tests are systems it runs
            named = [*(args.test or []), *([args.baseline] if args.baseline else [])]
            assert set(named) <= set(run.planned_systems(args, run.base_config(args))), (page.name, argv)
    training = _script_commands("train.py")
    assert training
    for _page, argv in training:
        train.parse(argv)  # exits (failing the test) on a bad option


@pytest.mark.kernel_free
def test_documented_benchmarks_are_registered():
    """Every ``python -m eval bench NAME`` and ``make bench NAME=...`` the pages and the code's docstrings show
    names a benchmark of the registry."""
    from eval.benchmarks import REGISTRY

    texts = [p.read_text(encoding="utf-8") for p in USER_PAGES]
    texts += [p.read_text(encoding="utf-8") for p in (REPO / "eval").rglob("*.py")]
    named = {
        m.group(1)
        for text in texts
        for m in re.finditer(r"python3? -m eval (?:bench|record) ([a-z0-9][a-z0-9-]*)", text)
    }
    named |= {m.group(1) for text in texts for m in re.finditer(r"make\s+bench NAME=([a-z0-9-]+)", text)}
    assert len(named) > 15 and named <= set(REGISTRY), sorted(named - set(REGISTRY))


# pages whose figures are rendered from the result files, or that record studies with their own commands
FIGURES_ELSEWHERE = {"benchmarks.md", "benchmark-records.md", "models.md", "studies.md", "CHANGELOG.md", "changelog.md"}
FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+x|\d+(?:\.\d+)?%|0\.\d{4})(?!\w)")


def _recorded_forms(figure: str) -> list[str]:
    """The ways a result file may print ``figure``: as written, a ratio without its ``x`` (a table's
    column), a percentage as a fraction."""
    if figure.endswith("x"):
        return [figure, f" {figure[:-1]} "]
    if not figure.endswith("%"):
        return [figure]
    value = float(figure[:-1]) / 100
    return [figure, f"{value:.2f}", f"{value:.1%}", f"{value:.0%}"]


@pytest.mark.kernel_free
@pytest.mark.parametrize(
    "page", [p for p in USER_PAGES if p.name not in FIGURES_ELSEWHERE], ids=lambda p: str(p.relative_to(REPO))
)
def test_every_measured_figure_in_a_page_is_in_a_result_file(page):
    """Speed ratios (``2.50x``), shares (``80%``) and quality figures (``0.6451``) in the prose of a user page
    are each printed by some benchmark recorded in eval/results; a figure no record holds is stale or made up."""
    recorded = "\n".join(r["output"] for r in render.load_results())
    prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    missing = [m[1] for m in FIGURE.finditer(prose) if not any(f in recorded for f in _recorded_forms(m[1]))]
    assert not missing, f"{page.relative_to(REPO)}: figures no result file holds: {missing}"
