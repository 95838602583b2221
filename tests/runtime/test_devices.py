"""Choosing the device a model runs on: names checked against what the machine has (a CUDA device named on a
machine without one is a clear error at load or at the service's start, never a crash), ``auto`` taking a GPU
only where there is one, and a GPU running the model on torch unless the backend is named. This machine's
GPUs are simulated where a test needs some (CI has none); nothing here computes on a GPU."""

from __future__ import annotations

import pytest

from embedrank import Encoder
from embedrank.errors import ConfigurationError, InvalidInputError
from embedrank.runtime import devices
from embedrank.runtime.devices import resolve_device
from embedrank.runtime.exports import runs_on
from embedrank.serving.pool import ModelEntry, ModelPool
from embedrank.testing.tiny import tiny_model
from service.settings import Settings, SettingsError


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(devices, "cuda_devices", lambda: 2)


def test_device_names_resolve_to_what_this_machine_has(monkeypatch):
    monkeypatch.setattr(devices, "cuda_devices", lambda: 0)
    assert [resolve_device(d) for d in (None, "cpu", "CPU", "auto", " auto ")] == ["cpu"] * 5
    for name in ("cuda", "cuda:0", "CUDA:1"):
        with pytest.raises(InvalidInputError, match="needs a CUDA GPU, and this machine has none") as refused:
            resolve_device(name)
        assert refused.value.param == "device" and "'auto'" in str(refused.value)
    for name in ("gpu", "cuda:", "cuda:-1", "mps", "cuda:0:1", ""):
        if name == "":
            assert resolve_device(name) == "cpu"  # unset
            continue
        with pytest.raises(InvalidInputError, match=r"device must be 'cpu', 'cuda', 'cuda:<index>' or 'auto'"):
            resolve_device(name)


def test_with_gpus_auto_takes_the_first_and_an_index_past_them_is_refused(two_gpus):
    assert [resolve_device(d) for d in ("auto", "cuda", "cuda:1", "cpu")] == ["cuda:0", "cuda:0", "cuda:1", "cpu"]
    with pytest.raises(InvalidInputError, match=r"this machine has 2 CUDA devices \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")


def test_a_gpu_runs_the_model_on_torch_in_half_precision_unless_named(two_gpus, monkeypatch):
    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    assert runs_on("cpu", None, None) == ("cpu", None, None)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    assert runs_on("auto", None, None) == ("cuda:0", "torch", "fp16")  # half precision unless named
    assert runs_on("cuda:1", "auto", "auto") == ("cuda:1", "torch", "fp16")
    assert runs_on("cuda", "torch", "fp32") == ("cuda:0", "torch", "fp32")
    assert runs_on("cuda", "openvino", None) == ("cuda:0", "openvino", None)  # named: refused at load, below
    assert runs_on("auto", None, None, static=True) == ("cpu", None, None)  # a lookup per token stays on the CPU
    with pytest.raises(InvalidInputError, match=r"a static model .* runs on the CPU"):
        runs_on("cuda", None, None, static=True)


def test_loading_on_a_device_this_machine_lacks_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(devices, "cuda_devices", lambda: 0)
    path = tiny_model("bert")
    with pytest.raises(InvalidInputError, match="needs a CUDA GPU"):
        Encoder.from_pretrained(path, device="cuda")
    encoder = Encoder.from_pretrained(path, device="auto", backend="torch")  # no GPU: the CPU
    assert str(encoder.device) == "cpu" and encoder.encode(["a text"]).shape == (1, encoder.dimension)


def test_an_exported_backend_named_with_a_gpu_is_refused_at_load(two_gpus):
    with pytest.raises(InvalidInputError, match="runs on the CPU in its own precision"):
        Encoder.from_pretrained(tiny_model("bert"), device="cuda", backend="openvino")


def test_the_service_refuses_a_device_the_machine_lacks_at_start(monkeypatch):
    monkeypatch.setattr(devices, "cuda_devices", lambda: 0)
    for env, message in (
        ({"EMBEDRANK_DEVICE": "cuda"}, "needs a CUDA GPU, and this machine has none"),
        ({"EMBEDRANK_DEVICE": "gpu"}, "device must be"),
    ):
        with pytest.raises(SettingsError, match=message) as refused:
            Settings.from_env(env)
        assert "EMBEDRANK_DEVICE" in str(refused.value)  # names the setting
    settings = Settings.from_env({"EMBEDRANK_DEVICE": "auto"})
    assert {m.device for m in settings.models.entries} == {"auto"}


def test_the_pool_records_where_each_model_runs(two_gpus, monkeypatch):
    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    path = tiny_model("bert")
    pool = ModelPool(
        (
            ModelEntry(id="gpu", path=path, device="auto"),
            ModelEntry(id="cpu", path=path),
            ModelEntry(id="second", path=path, device="cuda:1"),
        )
    )
    placed = {i: (m.device, m.backend, m.precision) for i, m in pool.plans.items()}
    assert placed == {
        "gpu": ("cuda:0", "torch", "fp16"),
        "cpu": ("cpu", "openvino", "fp32"),
        "second": ("cuda:1", "torch", "fp16"),
    }
    splade = ModelPool((ModelEntry(id="splade", path=tiny_model("bert", "masked-lm"), device="auto"),))
    assert splade.plans["splade"].device == "cuda:0"  # its precision is the runtime's, read once loaded
    with pytest.raises(ConfigurationError, match=r"model 'int8' on cuda:0: backend 'torch' runs precision fp32"):
        ModelPool((ModelEntry(id="int8", path=path, device="cuda", precision="int8"),))
    with pytest.raises(ConfigurationError, match=r"model 'far': device 'cuda:7': this machine has 2 CUDA devices"):
        ModelPool((ModelEntry(id="far", path=path, device="cuda:7"),))


def test_the_command_lines_take_a_device_and_refuse_one_the_machine_lacks(tmp_path, capsys, monkeypatch):

    from embedrank.embed import main as embed

    monkeypatch.setattr(devices, "cuda_devices", lambda: 0)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "d1", "title": "", "text": "green tea"}\n')
    assert embed([str(corpus), "--output", str(tmp_path / "out"), "--device", "cuda"]) == 2
    assert "needs a CUDA GPU, and this machine has none" in capsys.readouterr().err
    assert embed([str(corpus), "--output", str(tmp_path / "out"), "--runner", "ray", "--device", "cuda:1"]) == 2
    assert "on Ray, device is 'cpu', 'cuda' (one GPU per actor) or 'auto'" in capsys.readouterr().err

    from embedrank.retrieval.embed_ray import gpu_plan

    assert gpu_plan(8, 2, None) == (2, 1.0) and gpu_plan(2, None, 4) == (2, 4.0)
    with pytest.raises(InvalidInputError, match="3 actors of one GPU each, but the cluster has 2 GPUs"):
        gpu_plan(2, 3, None)

    from embedrank.retrieval.data import write_demo_collection
    from eval.train import main as train

    demo = str(write_demo_collection(tmp_path))  # a collection the commands could read, were the device there
    assert train([demo, "--output", str(tmp_path / "trained"), "--device", "cuda"]) == 2
    assert "device 'cuda' needs a CUDA GPU, and this machine has none" in capsys.readouterr().err
    monkeypatch.setattr(devices, "cuda_devices", lambda: 2)
    assert train([demo, "--output", str(tmp_path / "trained"), "--device", "cuda:1"]) == 2
    assert "run with CUDA_VISIBLE_DEVICES=1 and device 'cuda'" in capsys.readouterr().err
    monkeypatch.setattr(devices, "cuda_devices", lambda: 0)

    from eval.run import main as evaluate

    assert evaluate([demo, "--retriever", "dense", "--device", "cuda:1", "--no-cache"]) == 2
    assert "device 'cuda:1' needs a CUDA GPU" in capsys.readouterr().err


def test_a_faiss_index_goes_to_a_gpu_only_with_a_gpu_build_of_faiss():
    import numpy as np

    from embedrank.retrieval.index import build_index

    index = build_index(4, kind="flat")
    index.add(["a", "b"], np.eye(2, 4, dtype=np.float32))
    with pytest.raises(InvalidInputError, match=r"has no GPU support or sees no GPU: install a GPU build"):
        index.to_device("cuda")
    with pytest.raises(InvalidInputError, match="device must be 'cpu', 'cuda' or 'cuda:<index>'"):
        index.to_device("tpu")
    assert index.to_device("cpu").device == "cpu" and index.search(np.eye(1, 4, dtype=np.float32), 1)[1] == [["a"]]


@pytest.mark.parametrize("workers", [1, 3])
def test_texts_tokenized_ahead_give_what_texts_tokenized_in_turn_give(monkeypatch, workers):
    import numpy as np

    from embedrank.errors import InputTooLongError
    from embedrank.models import batching, tokens
    from embedrank.models import encoder as encoder_module

    monkeypatch.setattr(batching, "ahead_workers", lambda: workers)  # chunks tokenized at once, handed over in order
    monkeypatch.setattr(tokens, "AHEAD_CHUNK", 7)  # several chunks, the next ones tokenized while one runs
    monkeypatch.setattr(encoder_module, "AHEAD_CHUNK", 7)  # and vectors copied back every 7 texts or more
    enc = Encoder.from_pretrained(tiny_model("bert"), backend="torch")
    texts = [f"text number {i} " * (1 + i % 9) for i in range(40)]
    rows = enc.text_tokens

    def by_position(batches) -> dict[int, list[int]]:
        found = {}
        for positions, batch in batches:
            for j, position in enumerate(positions):
                found[position] = batch.features["input_ids"][j][batch.features["attention_mask"][j].bool()].tolist()
        return found

    ahead = by_position(rows.batches(texts, batch_size=4, ahead=True))
    assert sorted(ahead) == list(range(40)) and ahead == by_position(rows.batches(texts, batch_size=4))
    reference = Encoder.from_pretrained(tiny_model("bert"), backend="torch")
    expected = reference.encode_with_stats(texts, batch_size=4, dimensions=8)
    monkeypatch.setattr(type(enc), "on_gpu", property(lambda self: True))  # the GPU's way, on the CPU
    got = enc.encode_with_stats(texts, batch_size=4, dimensions=8)
    assert np.allclose(got.embeddings, expected.embeddings, atol=1e-6)
    assert got.token_counts == expected.token_counts and got.truncated == expected.truncated
    long = [*texts[:30], "word " * 500]  # in the fifth chunk: named by its position in the whole input
    with pytest.raises(InputTooLongError, match=r"texts\[30\]"):
        list(rows.batches(long, batch_size=4, truncate=False, ahead=True))


def test_tokenizing_ahead_uses_threads_of_its_own_only_where_the_tokenizer_uses_none(monkeypatch):
    from embedrank.models import batching

    monkeypatch.setattr(batching, "AHEAD_WORKERS", 6)
    for setting, workers in ((None, 1), ("true", 1), ("1", 1), ("false", 6), ("0", 6), ("OFF", 6), ("", 6)):
        if setting is None:
            monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
        else:
            monkeypatch.setenv("TOKENIZERS_PARALLELISM", setting)
        assert batching.ahead_workers() == workers, setting


def test_a_model_on_a_gpu_batches_what_its_memory_holds_unless_told(monkeypatch):
    import dataclasses

    import torch

    from embedrank.serving.engine import CPU_BATCH_SIZE, CPU_BATCH_TOKENS, BatchEngine, EngineConfig
    from embedrank.serving.hosting import GPU_BATCH_SIZE, GPU_WORKERS, engine_config_on
    from embedrank.serving.runners import EmbeddingBatchModel

    enc = Encoder.from_pretrained(tiny_model("bert"), backend="torch")
    config = EngineConfig()
    on_cpu = engine_config_on(config, enc, "cpu")  # unchanged: the engine's own defaults are the CPU's
    engine = BatchEngine(EmbeddingBatchModel(enc), on_cpu)
    assert on_cpu is config and (engine.max_batch_tokens, engine.max_batch_size) == (CPU_BATCH_TOKENS, CPU_BATCH_SIZE)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * 2**30, 80 * 2**30))
    on_gpu = engine_config_on(config, enc, "cuda:0")
    hidden = enc.model.config.hidden_size
    per_token = 4 * (
        8 * hidden + 2 * enc.model.config.intermediate_size + enc.model.config.num_attention_heads * enc.max_seq_length
    )
    assert on_gpu.max_batch_tokens == min(262_144, int(2**29 / per_token) // 1024 * 1024)
    assert on_gpu.max_batch_size == GPU_BATCH_SIZE and on_gpu.workers == GPU_WORKERS and on_cpu.workers is None
    told = engine_config_on(dataclasses.replace(config, max_batch_tokens=4096, max_batch_size=64), enc, "cuda:0")
    assert (told.max_batch_tokens, told.max_batch_size) == (4096, 64)
