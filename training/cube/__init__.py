"""The cube trainer: a 3-D cellular neural network trained on teacher embeddings.

Entry points for the ``cube_training`` / ``cube_inference`` kinds live in
``training.cube.run`` (``run``, ``verify``, ``infer``, ``verify_inference``); the model in
``training.cube.model``; the neighbour-band rule in ``training.cube.neighbours``.
"""

from training.cube.config import CubeConfig, CubeConfigError
from training.cube.data import CubeDataError
from training.cube.model import CubeModel
from training.cube.run import heldout_synthetic, infer, run, verify, verify_inference

__all__ = [
    "CubeConfig",
    "CubeConfigError",
    "CubeDataError",
    "CubeModel",
    "heldout_synthetic",
    "infer",
    "run",
    "verify",
    "verify_inference",
]
