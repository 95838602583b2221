"""CUDA graphs for small batches (embedrank.runtime.graphs) and the fixed-shape padded forward they record.

A CPU has no CUDA graphs: here a "capture" runs the forward eagerly on the same static buffers each replay,
which checks everything around the graph (buckets, buffers, padding rows, results cut to the batch, fallbacks);
the GPU check (eval/benchmarks/gpu.py) compares the real replay with sentence-transformers on a GPU.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from embedrank import CrossEncoder, Encoder
from embedrank.runtime import graphs, packed
from embedrank.runtime.backends import TorchRuntime
from embedrank.testing.tiny import TINY_SIZES, right_padded


def _eager_capture(runner: graphs.CudaGraphs, shape):
    """A stand-in for a CUDA graph on the CPU: each replay runs the forward on the static buffers again."""
    inputs = runner._buffers(shape)
    output = runner.forward(**inputs).clone()
    return graphs._Graph(lambda: output.copy_(runner.forward(**inputs)), inputs, output)


@pytest.mark.parametrize("kind", ["BertModel", "RobertaModel", "XLMRobertaModel"])
def test_the_padded_forward_equals_the_models_own(kind):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, kind)(getattr(transformers, kind.replace("Model", "Config"))(**TINY_SIZES)).eval()
    ids, mask = right_padded(model.config.pad_token_id or 0, [12, 3, 7, 1])
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = packed.padded_forward(model, ids, mask)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max() < 1e-5 and ours[~real].abs().max() == 0


def test_buckets_pad_rows_to_a_power_of_two_and_length_to_a_step():
    assert graphs.bucket(1, 1) == (1, 16)
    assert graphs.bucket(3, 16) == (4, 16) and graphs.bucket(5, 33) == (8, 48)
    assert graphs.bucket(32, 256) == (32, 256) and graphs.bucket(33, 100) == (64, 112)
    assert graphs.bucket(64, 129) is None  # over MAX_TOKENS: runs eagerly
    assert graphs.bucket(2, 20, max_tokens=64) == (2, 32) and graphs.bucket(2, 20, max_tokens=63) is None


def test_replayed_batches_equal_the_eager_forward_whatever_their_shape(monkeypatch):
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**TINY_SIZES)).eval()
    runner = graphs.CudaGraphs(partial(packed.padded_forward, model), torch.device("cpu"), token_types=True)
    captured = []
    monkeypatch.setattr(runner, "capture", lambda shape: captured.append(shape) or _eager_capture(runner, shape))
    for lengths, width in (([12, 3, 7, 1], 12), ([5, 2, 4], 5), ([3, 1], 3), ([16] * 4, 16), ([2], 2)):
        ids, mask = right_padded(0, lengths, width)
        types = (torch.arange(width) >= 1).long().expand(len(lengths), width) * mask
        with torch.inference_mode():
            ref = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
            got = runner({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        assert got.shape == ref.shape
        real = mask.bool()
        assert (got[real] - ref[real]).abs().max() < 1e-5
    assert captured == [(4, 16), (2, 16), (1, 16)]  # one graph per bucket, reused by every batch it holds
    huge = torch.ones(64, 200, dtype=torch.long)
    assert runner({"input_ids": huge, "attention_mask": huge}) is None  # too large: the caller runs it eagerly


def test_a_failed_capture_leaves_every_batch_to_the_eager_forward(monkeypatch, caplog):
    import transformers

    model = transformers.BertModel(transformers.BertConfig(**TINY_SIZES)).eval()
    runner = graphs.CudaGraphs(partial(packed.padded_forward, model), torch.device("cpu"), token_types=False)

    def fail(shape):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(runner, "capture", fail)
    ids, mask = right_padded(0, [4, 2])
    assert runner({"input_ids": ids, "attention_mask": mask}) is None
    assert "stream is capturing" in runner.failed and "CUDA graph capture failed" in caplog.text
    monkeypatch.setattr(runner, "capture", lambda shape: pytest.fail("not tried again"))
    assert runner({"input_ids": ids, "attention_mask": mask}) is None


@pytest.mark.slow
def test_a_runtime_with_graphs_gives_sentence_transformers_embeddings_and_scores(
    st_model, cross_encoder_dir, monkeypatch
):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    texts = ["A short query.", "What is the boiling point of water at sea level?", "mitochondria " * 40, "x"]
    encoder = Encoder.from_pretrained(backend="torch")
    assert encoder.runtime.graphs is None  # a CPU: no CUDA graphs
    runtime = encoder.runtime
    # set through monkeypatch: a loaded model may be shared with later tests, which must find no graphs
    monkeypatch.setattr(
        runtime,
        "graphs",
        graphs.CudaGraphs(partial(packed.padded_forward, runtime.module), runtime.device, token_types=True),
    )
    monkeypatch.setattr(runtime.graphs, "capture", partial(_eager_capture, runtime.graphs))
    ours = encoder.encode(texts, batch_size=4)
    assert runtime.graphs.graphs and runtime.graphs.failed is None
    assert np.abs(ours - st_model.encode(texts, normalize_embeddings=True)).max() < 1e-5

    ce = CrossEncoder.from_pretrained(cross_encoder_dir, backend="torch")
    ce_runtime = ce.runtime
    assert isinstance(ce_runtime, TorchRuntime)
    monkeypatch.setattr(
        ce_runtime,
        "graphs",
        graphs.CudaGraphs(
            partial(packed.padded_classifier_logits, ce_runtime.module), ce_runtime.device, token_types=True
        ),
    )
    monkeypatch.setattr(ce_runtime.graphs, "capture", partial(_eager_capture, ce_runtime.graphs))
    pairs = [("what causes the seasons", t) for t in texts]
    scores = ce.score_pairs(pairs)
    assert ce_runtime.graphs.graphs
    reference = STCrossEncoder(cross_encoder_dir, device="cpu").predict(pairs)
    assert np.abs(np.asarray(scores) - reference).max() < 1e-5


def test_a_graph_that_replays_something_else_is_not_used(monkeypatch, caplog):
    import transformers

    model = transformers.BertModel(transformers.BertConfig(**TINY_SIZES)).eval()
    runner = graphs.CudaGraphs(partial(packed.padded_forward, model), torch.device("cpu"), token_types=False)

    def stale(shape):  # replays the first batch it saw, whatever the buffers hold now
        entry = _eager_capture(runner, shape)
        return graphs._Graph(lambda: None, entry.inputs, entry.output)

    monkeypatch.setattr(runner, "capture", stale)
    ids, mask = right_padded(0, [4, 2])
    assert runner({"input_ids": ids, "attention_mask": mask}) is None and not runner.graphs
    assert "replay differs from the eager forward" in runner.failed and "run eagerly" in caplog.text
