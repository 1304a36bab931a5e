"""Isolated sign recognition on MediaPipe landmark sequences in Google's ISLR format.

Pure PyTorch + pyarrow, no Django. Entry points: ``training.asl.run.run`` (train),
``training.asl.run.verify`` (recompute held-out accuracy from a checkpoint),
``training.asl.run.predict`` (inference), ``training.asl.dataset.load_dataset`` (reader)
and ``training.asl.synthetic.generate`` (a dataset in the same format).
"""
