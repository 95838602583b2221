"""A server measures a provisional ``auto`` decision again once its model's engines are idle
(:func:`embedrank.serving.pool.remeasure_when_idle`), until a decision is confident or the server stops."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from embedrank.serving.pool import remeasure_when_idle

pytestmark = pytest.mark.kernel_free


class Engine:
    """Reports the idle times it is given, one per look, then idle for good."""

    def __init__(self, *idle: float) -> None:
        self.idle, self.looks = list(idle), 0

    def idle_for(self) -> float:
        self.looks += 1
        return self.idle.pop(0) if self.idle else 60.0


def decisions(*confident: bool):
    """A provisional decision whose re-measurements are confident or not, in turn; the calls are counted."""
    made = []

    def remeasure():
        made.append(len(made))
        sure = confident[len(made) - 1]
        return SimpleNamespace(
            backend="onnx", precision="int8", summary="onnx int8", remeasure=None if sure else remeasure
        )

    return SimpleNamespace(backend="openvino", precision="fp32", remeasure=remeasure), made


def test_it_waits_until_every_engine_is_idle_then_stops_at_a_confident_decision(caplog):
    choice, made = decisions(False, True)
    busy, quiet = Engine(0.0, 0.0, 0.5), Engine()
    remeasure_when_idle("m", choice, [busy, quiet], 0.01, threading.Event())
    assert made == [0, 1] and busy.looks >= 4  # not before the busy engine was idle; again while provisional
    assert "keeps openvino fp32 until its next start" in caplog.text


def test_a_stopping_server_measures_nothing():
    choice, made = decisions(True)
    stopping = threading.Event()
    stopping.set()
    remeasure_when_idle("m", choice, [Engine()], 0.01, stopping)
    assert made == []


def test_a_trial_that_fails_leaves_the_decision_and_says_why(caplog):
    def broken():
        raise MemoryError("no room for the candidates")

    remeasure_when_idle("m", SimpleNamespace(remeasure=broken), [Engine()], 0.01, threading.Event())
    assert "auto could not measure its runtimes again" in caplog.text
