"""Proof of training, the trainer's side: the trace a run writes and the platform's
re-execution of its segments (training.replay), for both trained kinds, tried as a
dishonest worker would."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.factories import TINY_ASL, TINY_CUBE
from training.artifacts import flatten_tensors, read_state_file, save_state_file, weights_sha256
from training.asl.run import measure_segments as asl_measure
from training.asl.run import replay_segments as asl_replay
from training.asl.run import run as asl_run
from training.asl.run import trainer as asl_trainer
from training.asl.synthetic import generate
from training.cube.run import measure_segments as cube_measure
from training.cube.run import replay_segments as cube_replay
from training.cube.run import run as cube_run
from training.cube.run import trainer as cube_trainer
from training.replay import CANARY_DISTANCE, TOLERANCE
from training.trace import (
    BAD_FRACTION,
    DETECT,
    VERIFY_SHARE,
    Leaf,
    Segment,
    Trace,
    checkpoint_name,
    file_sha256,
    read_trace,
    segments_needed,
    trace_every,
    trace_root,
)

CUBE = {**TINY_CUBE, "synthetic_samples": 96, "epochs": 2, "mixed_precision": False}
ASL = {**TINY_ASL, "epochs": 2, "mixed_precision": False}

Replay = Callable[..., list[str]]


@dataclasses.dataclass
class Run:
    """A traced run: its spec, the worker's data, its trace folder and the kind's replay."""

    spec: dict[str, Any]
    data: Path | None
    folder: Path
    replay: Replay
    trainer: Callable[..., Any]

    @property
    def trace(self) -> Trace:
        return read_trace(self.folder / "trace.json")

    def segment(self, i: int, end: Path | None = None, end_leaf: Leaf | None = None) -> Segment:
        a, b = self.trace.leaves[i], self.trace.leaves[i + 1]
        return Segment(
            self.folder / checkpoint_name(a.index), a, end or self.folder / checkpoint_name(b.index), end_leaf or b
        )


def _cube(root: Path, spec: dict[str, Any], every: int) -> Run:
    folder = root / "trace"
    built = cube_trainer(spec, None, "cpu")
    config = dataclasses.replace(built.config, trace_every=every)
    from training.loop import fit

    fit(
        built.model,
        built.train_loader,
        [],
        built.step_fn,
        lambda m, loader: {"val_loss": 0.0},
        config,
        trace_dir=folder,
    )
    return Run(spec, None, folder, cube_replay, lambda s, d: cube_trainer(s, d, "cpu"))


@pytest.fixture(scope="module")
def cube_fp32(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _cube(tmp_path_factory.mktemp("cube32"), CUBE, 3)


@pytest.fixture(scope="module")
def cube_bf16(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _cube(tmp_path_factory.mktemp("cube16"), {**CUBE, "mixed_precision": True}, 3)


@pytest.fixture(scope="module")
def asl_fp32(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("asl")
    data = generate(root / "signs.zip", n_signs=4, n_participants=4, per_participant=3, max_frames=16, as_zip=True)
    metrics = asl_run(ASL, data, root / "model", cache_dir=root / "cache", resume=False, trace_dir=root / "trace")
    assert metrics["trace"]["leaves"] >= 3
    return Run(ASL, data, root / "trace", asl_replay, lambda s, d: asl_trainer(s, d, "cpu", cache_dir=root / "c"))


def _forge(run: Run, i: int, tmp: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Segment:
    """Segment ``i`` with its end replaced by a forged checkpoint, its leaf matching it."""
    seg = run.segment(i)
    state = change(read_state_file(seg.end, 1 << 30))
    path = tmp / "forged.safetensors"
    save_state_file(path, state)
    model = run.trainer(run.spec, run.data).model
    model.load_state_dict(state["model"])
    leaf = dataclasses.replace(seg.end_leaf, state_sha256=file_sha256(path), weights_sha256=weights_sha256(model))
    return Segment(seg.start, seg.start_leaf, path, leaf)


@pytest.mark.parametrize("name", ["cube_fp32", "cube_bf16", "asl_fp32"])
def test_honest_segments_re_execute(name: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(name)
    trace = run.trace
    assert trace.leaves[0].step == 0
    assert trace.segments >= 2
    picks = sorted({0, trace.segments // 2, trace.segments - 1})
    assert run.replay(run.spec, run.data, [run.segment(i) for i in picks]) == [""] * len(picks)


def test_a_trace_is_bound_to_the_model_handed_back(tmp_path: Path) -> None:
    metrics = cube_run(CUBE, tmp_path / "none", tmp_path / "out", trace_dir=tmp_path / "trace")
    trace = read_trace(tmp_path / "trace" / "trace.json")
    assert metrics["trace"] == trace.commitment()
    assert file_sha256(tmp_path / "out" / "model.safetensors") in {leaf.weights_sha256 for leaf in trace.leaves}


def test_fp32_replay_from_mid_epoch_is_bit_exact(cube_fp32: Run) -> None:
    trace = cube_fp32.trace
    i = next(i for i, leaf in enumerate(trace.leaves[:-1]) if leaf.step % 3 == 0 and leaf.step > 0 and leaf.epoch)
    built = cube_trainer(cube_fp32.spec, None, "cpu")
    from training.loop import replay

    seg = cube_fp32.segment(i)
    replay(
        built.model,
        built.train_loader,
        built.step_fn,
        built.config,
        read_state_file(seg.start, 1 << 30),
        seg.end_leaf.step - seg.start_leaf.step,
    )
    assert weights_sha256(built.model) == seg.end_leaf.weights_sha256


@pytest.mark.parametrize("name", ["cube_bf16", "asl_fp32"])
def test_a_segment_with_a_skipped_step_is_rejected(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    run: Run = request.getfixturevalue(name)
    i = run.trace.segments // 2
    seg = run.segment(i)
    steps = seg.end_leaf.step - seg.start_leaf.step
    # The worker does one step fewer than the segment says, and commits what it got (its
    # start again, when the segment is one step long).
    built = run.trainer(run.spec, run.data)
    from training.loop import replay

    start = read_state_file(seg.start, 1 << 30)
    short = (
        start if steps == 1 else replay(built.model, built.train_loader, built.step_fn, built.config, start, steps - 1)
    )
    short["loop"]["global_step"] = seg.end_leaf.step
    forged = _forge(run, i, tmp_path, lambda end: {**end, "model": short["model"], "optimizer": short["optimizer"]})
    [reason] = run.replay(run.spec, run.data, [forged])
    assert reason.startswith(f"segment {i} (steps {seg.start_leaf.step}→{seg.end_leaf.step}) does not re-execute")
    assert "of a step's update away; tolerance" in reason


def test_a_fabricated_end_is_rejected(cube_bf16: Run, tmp_path: Path) -> None:
    start = read_state_file(cube_bf16.segment(1).start, 1 << 30)

    def halfway(end: dict[str, Any]) -> dict[str, Any]:
        return {**end, "model": {k: (v + start["model"][k]) / 2 for k, v in end["model"].items()}}

    [reason] = cube_bf16.replay(cube_bf16.spec, None, [_forge(cube_bf16, 1, tmp_path, halfway)])
    assert "does not re-execute" in reason


def test_a_start_checkpoint_that_does_not_match_its_leaf_is_refused(cube_fp32: Run, tmp_path: Path) -> None:
    seg = cube_fp32.segment(1)
    other = cube_fp32.segment(2).start
    [reason] = cube_fp32.replay(cube_fp32.spec, None, [dataclasses.replace(seg, start=other)])
    assert reason == (
        f"segment 1 (steps {seg.start_leaf.step}→{seg.end_leaf.step}) cannot be re-executed: "
        "checkpoint 1 does not match the sha256 its leaf commits to."
    )


def test_a_trained_model_passed_off_as_the_untrained_one_is_refused(cube_fp32: Run, tmp_path: Path) -> None:
    seg = cube_fp32.segment(0)
    later = cube_fp32.segment(3).start
    shutil.copy(later, tmp_path / "zero.safetensors")
    leaf = dataclasses.replace(cube_fp32.trace.leaves[3], index=0, step=0)
    [reason] = cube_fp32.replay(
        cube_fp32.spec, None, [Segment(tmp_path / "zero.safetensors", leaf, seg.end, seg.end_leaf)]
    )
    assert "checkpoint 0 is not the untrained model the spec's seed gives" in reason


@pytest.mark.parametrize(
    ("make", "says"),
    [
        ("pickle", "not a safetensors file"),
        ("extra", "tensors it does not describe"),
        ("shape", "do not fit the model: wrong shape"),
        ("moments", "its optimizer state does not fit the model"),
    ],
)
def test_malformed_checkpoint_files_are_refused(cube_fp32: Run, tmp_path: Path, make: str, says: str) -> None:
    seg = cube_fp32.segment(1)
    path = tmp_path / "bad.safetensors"
    if make == "pickle":
        torch.save({"model": torch.zeros(3)}, path)
    else:
        state = read_state_file(seg.start, 1 << 30)
        if make == "shape":
            name = next(iter(state["model"]))
            state["model"][name] = torch.zeros(2, 2)
        if make == "moments":
            # A running mean of another shape: refused before the optimizer ever sees it,
            # however many states of the right shapes this model has loaded before.
            cube_fp32.replay(cube_fp32.spec, None, [seg])
            first = next(iter(state["optimizer"]["state"].values()))
            first["exp_avg"] = torch.zeros(*first["exp_avg"].shape, 2)
        save_state_file(path, state)
        if make == "extra":
            from safetensors import safe_open
            from safetensors.torch import load_file

            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata()
            tensors = {**load_file(str(path)), "smuggled": torch.zeros(1)}
            save_file(tensors, str(path), metadata=metadata)
    leaf = dataclasses.replace(seg.start_leaf, state_sha256=file_sha256(path))
    [reason] = cube_fp32.replay(cube_fp32.spec, None, [Segment(path, leaf, seg.end, seg.end_leaf)])
    assert "cannot be re-executed" in reason
    assert says in reason, reason


def test_the_root_changes_with_any_leaf(cube_fp32: Run) -> None:
    leaves = cube_fp32.trace.leaves
    root = trace_root(leaves)
    for field in ("step", "epoch", "loss_micro"):
        changed = list(leaves)
        changed[1] = dataclasses.replace(leaves[1], **{field: getattr(leaves[1], field) + 1})
        assert trace_root(changed) != root
    changed = list(leaves)
    changed[-1] = dataclasses.replace(leaves[-1], weights_sha256="0" * 64)
    assert trace_root(changed) != root


# --- delegated re-execution: what a verifier node measures, and the platform's canary ------


def _canary_of(run: Run) -> Callable[..., str]:
    from training.asl.run import canary_segment as asl_canary
    from training.cube.run import canary_segment as cube_canary

    return asl_canary if run.spec is ASL else cube_canary


@pytest.mark.parametrize("name", ["cube_fp32", "cube_bf16", "asl_fp32"])
def test_a_verifier_measures_honest_segments_in_and_a_canary_out(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A canary is the segment trained again with some steps on another step's rows: a
    checkpoint the replay takes as any other, its hashes consistent, that lands at least
    CANARY_DISTANCE steps' updates from an honest re-execution, where a node that computes
    finds it. Every trained tensor moved, the second moments too: nothing in the file is the
    committed end's but what training does not change."""
    run: Run = request.getfixturevalue(name)
    measure = asl_measure if run.spec is ASL else cube_measure
    canary = tmp_path / "canary.safetensors"
    # A one-step segment's other rows do not always land CANARY_DISTANCE away (the platform
    # then tries another segment, CANARY_TRIES): the first of a few that makes one.
    for i in range(2, min(8, run.trace.segments)):
        honest = run.segment(i)
        try:
            weights = _canary_of(run)(run.spec, run.data, honest, canary)
            break
        except ValueError:
            continue
    else:
        pytest.fail("no segment of the run makes a canary")
    moved = dataclasses.replace(honest.end_leaf, state_sha256=file_sha256(canary), weights_sha256=weights)
    near, far = measure(run.spec, run.data, [honest, Segment(honest.start, honest.start_leaf, canary, moved)])
    assert isinstance(near, float)
    assert near <= TOLERANCE
    assert isinstance(far, float), far  # re-executed, not refused: its hashes hold
    assert far > CANARY_DISTANCE - 0.2  # measured from its own replay, not the committed end
    made, end = read_state_file(canary, 1 << 30), read_state_file(honest.end, 1 << 30)
    for part in ("loop", "scheduler", "scaler"):
        assert made[part] == end[part]
    assert made["optimizer"]["param_groups"] == end["optimizer"]["param_groups"]
    trained = {k: v for k, v in flatten_tensors(end["optimizer"], "o").items() if v.dim()}
    ours = flatten_tensors(made["optimizer"], "o")
    assert any(k.endswith("exp_avg_sq") for k in trained)
    assert all(not torch.equal(ours[k], v) for k, v in trained.items() if v.abs().sum() > 0)


def test_a_canary_is_written_by_the_worker_s_own_code(cube_fp32: Run, tmp_path: Path) -> None:
    """With no step on other rows, the canary's re-execution is the worker's segment: its file
    holds the committed checkpoint's structure, settings and counters and equal tensors (a
    zero's sign aside), so nothing but the replaced rows sets a canary apart from an honest end."""
    from training.cube.run import trainer
    from training.replay import canary_state

    honest = cube_fp32.segment(1)
    out = tmp_path / "same.safetensors"
    weights = canary_state(
        lambda s, d, dev: trainer(s, d, dev), CUBE, None, honest, out, draw=lambda steps, k: [], least=0.0
    )
    assert weights == honest.end_leaf.weights_sha256
    made, end = read_state_file(out, 1 << 30), read_state_file(honest.end, 1 << 30)
    ours, theirs = flatten_tensors(made), flatten_tensors(end)
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == v.dtype and torch.equal(ours[k], v) for k, v in theirs.items())
    for part in ("loop", "scheduler", "scaler"):
        assert made[part] == end[part]
    assert made["optimizer"]["param_groups"] == end["optimizer"]["param_groups"]


def test_no_canary_is_made_where_other_rows_do_not_move_the_segment_far_enough(asl_fp32: Run, tmp_path: Path) -> None:
    """A segment of one step trained on another step's rows lands about one step's update
    away: asked for more, no canary is made of it (the platform then tries another segment,
    or re-executes every segment itself) rather than one an honest verifier might pass."""
    from training.replay import canary_state

    out = tmp_path / "canary.safetensors"
    with pytest.raises(ValueError, match="no canary of segment 4"):
        canary_state(
            lambda s, d, dev: asl_trainer(s, d, dev, cache_dir=tmp_path / "c"),
            ASL,
            asl_fp32.data,
            asl_fp32.segment(4),
            out,
            least=1.5,
        )
    assert not out.exists()


@pytest.mark.parametrize("steps", [800, 1_124, 2_310, 4_500, 20_000, 250_000])
def test_a_challenge_replays_at_most_the_budgeted_share_of_the_steps(steps: int) -> None:
    # The budget leaves room within the 10 % goal for a replayed step costing more than a
    # trained one (fp32 against bf16) and for each segment's set-up.
    assert VERIFY_SHARE <= 0.06
    k = trace_every(steps)
    segments = -(-steps // k)
    drawn = segments_needed(segments, DETECT, BAD_FRACTION)
    if VERIFY_SHARE * steps >= segments_needed(steps, DETECT, BAD_FRACTION):
        assert drawn * k <= VERIFY_SHARE * steps
    else:  # too short a run for segments of more than one step
        assert k == 1
