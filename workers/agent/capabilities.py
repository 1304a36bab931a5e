"""What this node can offer, reported at registration."""

from __future__ import annotations

import os
from typing import Any

from training.kinds import KINDS
from training.plugin import REPLAYABLE_TRAINING, SHARDED_DATASETS
from training.poc.spec import GENERATORS, feature
from workers.agent import AGENT_VERSION

# Only the kinds this agent has a plug-in for: the scheduler offers a worker nothing else.
SUPPORTED_KINDS = list(KINDS)
# Protocol features the scheduler matches against a task's needs (marketplace.kinds):
# the ways this agent can draw the synthetic kind's matrices, that it takes verification
# jobs (verify_job.py; the platform's workers.assignments.delegation.FEATURE), its
# download of a dataset in shards (``transfer.PlatformClient.download_folder``), and that
# its trainer re-executes as the platform's does (``training.plugin.REPLAYABLE_TRAINING``).
FEATURES = [
    *(feature(generator) for generator in GENERATORS),
    "verify_segments",
    SHARDED_DATASETS,
    REPLAYABLE_TRAINING,
]


def detect() -> dict[str, Any]:
    """CPU cores, RAM, GPU name, GPU memory and CUDA version (via torch), kinds, version."""
    caps: dict[str, Any] = {
        "cpu_cores": os.cpu_count() or 1,
        "ram_bytes": _ram_bytes(),
        "gpu_name": "",
        "gpu_memory_bytes": 0,
        "cuda_version": "",
        "kinds": list(SUPPORTED_KINDS),
        "features": list(FEATURES),
        "agent_version": AGENT_VERSION,
    }
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            caps["gpu_name"] = props.name
            caps["gpu_memory_bytes"] = int(props.total_memory)
            caps["cuda_version"] = torch.version.cuda or ""
    except ImportError:
        pass
    return caps


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0
