"""training.stop: a requested stop ends the training loop, the proof-of-compute products
and their generation within one step, and a new job starts without a leftover stop."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.training.test_loop import _eval, _loaders, _model, _step
from tests.training.test_poc import SEED
from training import poc, stop
from training.loop import LoopConfig, fit
from training.poc.generate import generate_matrix


@pytest.fixture(autouse=True)
def _no_leftover_stop() -> Any:
    stop.clear()
    yield
    stop.clear()


def test_fit_stops_at_the_next_step_once_asked() -> None:
    events: list[dict[str, Any]] = []

    def progress(event: dict[str, Any]) -> None:
        events.append(event)
        if event["event"] == "step" and event["step"] == 3:
            stop.request("the requester cancelled the task")

    train, val = _loaders()
    with pytest.raises(stop.Stopped, match="the requester cancelled the task"):
        fit(_model(), train, val, _step, _eval, LoopConfig(epochs=6), progress=progress)
    assert [e["step"] for e in events] == [1, 2, 3]  # no step after the request


def test_fit_stops_during_validation() -> None:
    seen: list[int] = []

    def eval_fn(model: Any, loader: Any) -> dict[str, float]:
        for n, _batch in enumerate(loader):
            seen.append(n)
            stop.request("operator")
        return {"val_loss": 0.0}

    train, val = _loaders()
    with pytest.raises(stop.Stopped):
        fit(_model(), train, val, _step, eval_fn, LoopConfig(epochs=2))
    assert seen == [0]  # the second validation batch was never computed


def test_the_products_stop_between_pairs_and_generation_between_chunks(tmp_path: Path) -> None:
    pairs: list[int] = []

    def progress(event: dict[str, Any]) -> None:
        pairs.append(event["step"])
        stop.request("the worker was suspended")

    with pytest.raises(stop.Stopped, match="suspended"):
        poc.run({"n": 64, "count": 4}, SEED, tmp_path, device="cpu", progress=progress)
    assert pairs == [1]
    with pytest.raises(stop.Stopped):
        generate_matrix(bytes(32), "A", 0, 256, 8, generator="aes256ctr")
    with pytest.raises(stop.Stopped):
        generate_matrix(bytes(32), "A", 0, 256, 8, generator="shake128")


def test_a_new_job_starts_without_a_leftover_stop() -> None:
    stop.request("for the job before")
    with stop.watching():
        stop.check()  # does not raise
        other = threading.Thread(target=stop.request, args=("from the reporter's thread",))
        other.start()
        other.join()
        with pytest.raises(stop.Stopped, match="reporter"):
            stop.check()
    assert stop.requested() is None
