"""Command line: ``python -m training.asl {synthetic,train,verify,predict,export-onnx} ...``.

Errors in the data or the spec print one line naming the file or field and exit with 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from training.artifacts import ArtifactError
from training.asl.parquet import DatasetError


def _print_event(event: dict[str, Any]) -> None:
    if event.get("event") == "epoch":
        val = event.get("val", {})
        print(
            f"epoch {event['epoch']}/{event['epochs']}: val_top1 {val.get('val_top1', 0):.3f} "
            f"val_top5 {val.get('val_top5', 0):.3f} val_loss {val.get('val_loss', 0):.4f}",
            flush=True,
        )
    elif event.get("event") == "reading" and event["done"] == event["total"]:
        print(f"read {event['total']} sequences", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run one command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m training.asl", description="ISLR sign recognition.")
    sub = parser.add_subparsers(dest="command", required=True)
    syn = sub.add_parser("synthetic", help="write a synthetic ISLR-format dataset (.zip or folder)")
    syn.add_argument("target", type=Path)
    syn.add_argument("--signs", type=int, default=10)
    syn.add_argument("--participants", type=int, default=5)
    syn.add_argument("--per-participant", type=int, default=4)
    syn.add_argument("--seed", type=int, default=0)
    train = sub.add_parser("train", help="train on a dataset; artifacts go to OUT")
    train.add_argument("data", type=Path)
    train.add_argument("out", type=Path)
    train.add_argument("--spec", default="{}", help="asl_training spec as JSON, e.g. '{\"epochs\": 5}'")
    train.add_argument("--onnx", action="store_true", help="also export model.onnx and check it")
    ver = sub.add_parser("verify", help="recompute accuracy of a trained model on a labelled dataset")
    ver.add_argument("model", type=Path)
    ver.add_argument("data", type=Path)
    pred = sub.add_parser("predict", help="write predictions.csv (top-k signs) for sequences")
    pred.add_argument("model", type=Path)
    pred.add_argument("inputs", type=Path)
    pred.add_argument("out", type=Path)
    pred.add_argument("--top-k", type=int, default=5)
    onnx = sub.add_parser("export-onnx", help="export a trained model to ONNX (competition contract)")
    onnx.add_argument("model", type=Path)
    onnx.add_argument("target", type=Path)
    args = parser.parse_args(argv)

    try:
        if args.command == "synthetic":
            from training.asl.synthetic import generate

            path = generate(
                args.target,
                n_signs=args.signs,
                n_participants=args.participants,
                per_participant=args.per_participant,
                seed=args.seed,
                as_zip=args.target.suffix == ".zip",
            )
            print(f"wrote {path}")
        elif args.command == "train":
            from training.asl.run import run

            try:
                spec = json.loads(args.spec)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--spec is not valid JSON ({exc})") from None
            if not isinstance(spec, dict):
                raise ValueError("--spec must be a JSON object")
            metrics = run(spec, args.data, args.out, _print_event, export_onnx=args.onnx)
            print(json.dumps({k: metrics[k] for k in ("val_top1", "val_top5", "val_loss", "epochs_run")}))
        elif args.command == "verify":
            from training.asl.run import verify

            result = verify(args.model, args.data)
            print(json.dumps({k: result[k] for k in ("top1", "top5", "loss", "count")}))
        elif args.command == "predict":
            from training.asl.infer import predict

            print(json.dumps(predict(args.model, args.inputs, args.out, args.top_k)))
        else:
            from training.asl import export

            model, _ = export.load(args.model)
            print(f"wrote {export.export_onnx(model, args.target)}")
    except (DatasetError, ArtifactError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
