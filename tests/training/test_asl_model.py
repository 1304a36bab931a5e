"""Preprocessing and model: NaN handling, padding that never leaks, export with parity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from training.asl import export
from training.asl.landmarks import REFERENCE_POINT, selected_landmarks
from training.asl.model import MaskedBatchNorm, ModelConfig, SignModel
from training.asl.preprocess import HIDDEN, Featurizer, drop_empty_frames

POINTS = selected_landmarks(use_pose=False)
NAN = float("nan")


def small_model(classes: int = 7, max_len: int = 24) -> SignModel:
    torch.manual_seed(0)
    model = SignModel(ModelConfig(num_classes=classes, dim=32, blocks=1, max_len=max_len))
    # Non-trivial running statistics, as after training.
    for module in model.modules():
        if isinstance(module, MaskedBatchNorm):
            module.running_mean.normal_(0, 0.2)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def test_featurizer_centres_scales_drops_empty_frames_and_masks_padding() -> None:
    feat = Featurizer(POINTS, max_len=10)
    ref = POINTS.index(REFERENCE_POINT)
    x = torch.rand(1, 6, len(POINTS), 3)
    x[0, 2] = NAN  # a frame with no point at all: dropped
    x[0, 4, :40] = NAN  # lips missing: the frame stays
    feats, mask = feat(torch.cat([x, torch.full_like(x, NAN)], 1), torch.tensor([6]))
    assert feats.shape == (1, 10, 3 * len(POINTS) * 2)
    assert mask[0].tolist() == [True] * 5 + [False] * 5
    assert not torch.isnan(feats).any()
    assert (feats[0, 5:] == 0).all()
    pos = feats[0, :5, : len(POINTS) * 2].reshape(5, len(POINTS), 2)
    # Centred on the reference point's mean over the frames where it is seen.
    assert pos[[0, 1, 2, 4], ref].mean(0).abs().max() < 1e-5
    kept = x[0, [0, 1, 3, 4, 5]]
    expected = kept[..., :2] - kept[[0, 1, 2, 4], ref, :2].mean(0)
    # Each axis by its own root mean square about that centre.
    scale = torch.sqrt(torch.nanmean(expected**2, dim=(0, 1)))
    torch.testing.assert_close(pos[1, 50], expected[1, 50] / scale)
    assert (pos[3, :40] == 0).all()  # the missing lips are zero-filled
    lag1 = feats[0, :5, len(POINTS) * 2 : len(POINTS) * 4]
    torch.testing.assert_close(lag1[2, 100], feats[0, 2, 100] - feats[0, 1, 100])
    assert (lag1[0] == 0).all()


@pytest.mark.parametrize("per_axis", [True, False])
def test_per_axis_normalisation_gives_each_axis_unit_spread_and_scalar_one_for_both(per_axis: bool) -> None:
    """A signer filmed wide (x spread 4× y): per axis, each axis ends with unit root mean
    square about the reference point; with one figure, only the two together do, and the
    aspect survives."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 12, len(POINTS), 3, generator=gen)
    x[..., 0] *= 4.0
    x[0, 3, :30] = NAN
    feats, _mask = Featurizer(POINTS, max_len=12, per_axis=per_axis)(x, torch.tensor([12]))
    pos = feats[0, :, : len(POINTS) * 2].reshape(12, len(POINTS), 2)
    seen = ~torch.isnan(x[0, :, :, 0])
    rms = torch.sqrt((pos[seen] ** 2).mean(0))
    if per_axis:
        torch.testing.assert_close(rms, torch.ones(2))
    else:
        torch.testing.assert_close((pos[seen] ** 2).mean(), torch.tensor(1.0))
        assert rms[0] > 3 * rms[1]


def test_a_model_config_written_before_the_recipe_fields_loads_as_the_model_it_was(tmp_path: Path) -> None:
    """config.json without ``mlp_expand`` and ``normalisation`` (written before they
    existed) means an MLP of 4× and one scale for both axes: its weights load and its
    outputs are unchanged."""
    torch.manual_seed(0)
    old = SignModel(ModelConfig(num_classes=3, dim=32, blocks=1, max_len=16, mlp_expand=4, normalisation="scalar"))
    export.save(tmp_path, old, ["a", "b", "c"])
    config = json.loads((tmp_path / "config.json").read_text())
    del config["mlp_expand"], config["normalisation"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded, _ = export.load(tmp_path)
    assert loaded.config.mlp_expand == 4
    assert loaded.config.normalisation == "scalar"
    x = torch.rand(2, 9, len(POINTS), 3)
    lengths = torch.tensor([9, 6])
    torch.testing.assert_close(loaded(x, lengths), old.eval()(x, lengths))


def test_numpy_frame_dropping_matches_the_featurizer() -> None:
    x = np.random.default_rng(0).random((8, len(POINTS), 3)).astype(np.float32)
    x[[1, 5]] = np.nan
    assert drop_empty_frames(x, 4).shape == (4, len(POINTS), 3)
    np.testing.assert_array_equal(drop_empty_frames(x, 10), x[[0, 2, 3, 4, 6, 7]])


def test_a_hidden_frame_keeps_its_place_with_zero_features_and_counts_towards_nothing() -> None:
    feat = Featurizer(POINTS, max_len=10)
    x = torch.rand(1, 6, len(POINTS), 3)
    x[0, 1] = NAN  # nothing seen: dropped
    x[0, 3] = HIDDEN  # masked: kept in place, all zeros
    x[0, 4, :40] = HIDDEN  # lips masked, the rest seen
    feats, mask = feat(x, torch.tensor([6]))
    assert mask[0].tolist() == [True] * 5 + [False]
    assert not torch.isnan(feats).any()
    assert (feats[0, 2] == 0).all()  # frame 3, after frame 1 was dropped
    pos = feats[0, :5, : len(POINTS) * 2].reshape(5, len(POINTS), 2)
    assert (pos[3, :40] == 0).all()
    assert (pos[3, 40:] != 0).all()
    # Hidden points weigh in nowhere: the same as those points undetected, bar frame 3's place.
    same = x.clone()
    same[0, 4, :40] = NAN
    seen, _ = feat(same[:, [0, 2, 4, 5]], torch.tensor([4]))
    ours = feats[0, [0, 1, 3, 4], : len(POINTS) * 2]
    torch.testing.assert_close(ours, seen[0, :4, : len(POINTS) * 2])
    np.testing.assert_array_equal(drop_empty_frames(x[0].numpy(), 10), x[0, [0, 2, 3, 4, 5]].numpy())


def test_truncates_to_max_len() -> None:
    feats, mask = Featurizer(POINTS, max_len=16)(torch.rand(2, 40, len(POINTS), 3), torch.tensor([40, 9]))
    assert feats.shape[1] == 16
    assert mask.sum(1).tolist() == [16, 9]


def test_padding_does_not_change_the_output_in_eval() -> None:
    model = small_model()
    x = torch.rand(1, 12, len(POINTS), 3)
    alone = model(x, torch.tensor([12]))
    padded = torch.cat([x, torch.rand(1, 8, len(POINTS), 3)], 1)  # garbage, not NaN, beyond the length
    batch = torch.cat([padded, torch.rand(1, 20, len(POINTS), 3)])
    together = model(batch, torch.tensor([12, 20]))
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-5)


def test_masked_batchnorm_ignores_padded_frames() -> None:
    norm = MaskedBatchNorm(3, momentum=1.0)
    x = torch.randn(2, 5, 3)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    x_garbage = x.clone()
    x_garbage[1, 2:] = 1e6
    out = norm(x_garbage, mask)
    real = torch.cat([x[0], x[1, :2]])
    torch.testing.assert_close(norm.running_mean, real.mean(0))
    torch.testing.assert_close(out[mask].mean(0), torch.zeros(3), atol=1e-5, rtol=0)


def test_model_trains_a_step_and_handles_an_empty_sequence() -> None:
    model = small_model().train()
    x = torch.rand(3, 10, len(POINTS), 3)
    x[2] = NAN
    logits = model(x, torch.tensor([10, 4, 10]))
    assert logits.shape == (3, 7)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(p.grad is not None for p in model.stem.parameters())


def test_artifacts_round_trip(tmp_path: Path) -> None:
    model = small_model()
    signs = [f"s{i}" for i in range(7)]
    export.save(tmp_path, model, signs)
    assert {"model.safetensors", "config.json", "labels.json"} <= {p.name for p in tmp_path.iterdir()}
    again, labels = export.load(tmp_path)
    assert labels == signs
    x = torch.rand(2, 9, len(POINTS), 3)
    torch.testing.assert_close(again(x, torch.tensor([9, 5])), model(x, torch.tensor([9, 5])))


def test_onnx_export_matches_pytorch_on_the_competition_contract(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = small_model(max_len=24)
    path = export.export_onnx(model, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,), (_out,) = session.get_inputs(), session.get_outputs()
    assert inp.name == "inputs"
    assert inp.type == "tensor(float)"
    assert inp.shape[1:] == [543, 3]
    rng = np.random.default_rng(0)
    sequences = []
    for frames in (1, 7, 24, 60):  # shorter and longer than the export example and max_len
        seq = rng.random((frames, 543, 3)).astype(np.float32)
        seq[: frames // 2, 468:489] = np.nan  # left hand missing
        seq[frames // 3 :, 522:543] = np.nan  # right hand missing
        sequences.append(seq)
    empty_frames = rng.random((9, 543, 3)).astype(np.float32)
    empty_frames[[2, 3, 6]] = np.nan
    masked = rng.random((12, 543, 3)).astype(np.float32)
    masked[[1, 8]] = np.nan
    masked[3:6] = HIDDEN  # as training's time mask leaves them
    sequences += [empty_frames, np.full((4, 543, 3), np.nan, np.float32), masked, np.full((3, 543, 3), HIDDEN)]
    assert export.onnx_parity(model, path, sequences) < 1e-4
    assert session.run(None, {"inputs": sequences[1]})[0].shape == (7,)
