"""A verification job on the node: re-execute another provider's challenged training
segments and answer with their distances, signed (docs/proof-of-training.md#delegated-re-execution).

The platform sends the job's id on the node's own queue (``agent.verify_segments``). The
node fetches the job, downloads the worker's data (a dataset in shards through the kind's
ingest, as the job's own run does) and each slot's two checkpoints (each checked against
the sha256 the job gives), re-executes every slot with the kind's
``measure`` (the same replay code the platform runs), and posts, signed with its node key,
each slot's distance in micro steps' updates, or why it could not be re-executed. Some
slots are canaries whose ends the platform moved: a node that answers without computing
is found out, and its answer thrown away. Nothing here is unpickled: checkpoints are read
as safetensors by the replay.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
from pathlib import Path
from typing import Any

from protocol import keys
from protocol.encoding import canonical_json
from training import kinds as node_kinds
from training.device import select_device
from training.plugin import SHARDS_FORMAT
from training.trace import Leaf, Segment
from workers.agent import runners
from workers.agent.transfer import JobError, PlatformClient

log = logging.getLogger("workers.agent")
# The platform's ``workers.assignments.delegation.ANSWER_DOMAIN``: what the node signs is
# this, then the answer's canonical JSON.
ANSWER_DOMAIN = b"proofwork/verification-answer/v1\n"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SLOT = re.compile(r"[0-9a-f]{1,32}")
_FORMAT = re.compile(r"[a-z0-9]{1,8}")
MAX_DISTANCE_MICRO = 10**15  # an infinite distance is reported as this


def sign_answer(key: keys.KeyPair, job_id: str, address: str, slots: list[dict[str, Any]]) -> dict[str, Any]:
    """The body the node posts: its answer and its signature over ``ANSWER_DOMAIN`` + the answer."""
    answer = {"verification": job_id, "verifier": address, "slots": slots}
    signature = keys.sign(key.seed, ANSWER_DOMAIN + canonical_json(answer, "answer"))
    return {"answer": answer, "signature": signature.hex()}


def _leaf(raw: Any) -> Leaf:
    if not isinstance(raw, dict):
        raise JobError("the platform sent a slot end that is not an object")
    index, step = raw.get("index"), raw.get("step")
    state, weights = str(raw.get("state_sha256")), str(raw.get("weights_sha256"))
    if type(index) is not int or type(step) is not int or index < 0 or step < 0:
        raise JobError("the platform sent a slot end without an integer index and step")
    if not _HEX64.fullmatch(state) or not _HEX64.fullmatch(weights):
        raise JobError("the platform sent a slot end without sha256 hashes")
    return Leaf(index=index, step=step, epoch=0, loss_micro=0, state_sha256=state, weights_sha256=weights)


def _entry(slot_id: str, measured: float | str) -> dict[str, Any]:
    if isinstance(measured, str):
        return {"id": slot_id, "distance_micro": None, "problem": measured[:300] or "cannot be re-executed"}
    micro = MAX_DISTANCE_MICRO if not math.isfinite(measured) else min(MAX_DISTANCE_MICRO, round(measured * 1e6))
    return {"id": slot_id, "distance_micro": max(0, micro), "problem": ""}


def run(client: PlatformClient, key: keys.KeyPair, job_id: str, device: str | None = None) -> str:
    """Run one verification job to its answer: answered, gone, unsupported or refused."""
    base = f"/api/v1/verifications/{job_id}"
    response = client.request("GET", f"{base}/")
    if response.status_code != 200:
        log.error("verification job %s: %s", job_id, response.text[:300])
        return "gone"
    job = response.json()
    kind = node_kinds.KINDS.get(str(job.get("kind")))
    if kind is None or kind.measure is None:
        log.error("verification job %s: this agent cannot re-execute %r", job_id, job.get("kind"))
        return "unsupported"
    raw_slots = job.get("slots")
    if not isinstance(raw_slots, list) or not raw_slots:
        log.error("verification job %s names no slots", job_id)
        return "refused"
    with tempfile.TemporaryDirectory(prefix="proofwork-verify-") as tmp:
        folder = Path(tmp)
        data = None
        dataset = job.get("dataset")
        if dataset:
            fmt = str(dataset.get("format"))
            if not _FORMAT.fullmatch(fmt):
                raise JobError(f"the platform sent a dataset format this node will not use: {fmt!r}")
            size = dataset.get("size_bytes")
            data = folder / f"dataset.{fmt}"
            digest, known = str(dataset.get("sha256") or ""), size if type(size) is int else None
            if fmt == SHARDS_FORMAT:
                # Ingested as the job's own run would be: the replay reads the same cache.
                ingest = runners.ingest(job)
                client.download_folder(f"{base}/dataset/", data, sha256=digest, size=known, ingest=ingest)
            else:
                client.download(f"{base}/dataset/", data, sha256=digest, size=known)
        ids, segments = [], []
        for slot in raw_slots:
            slot_id = str(slot.get("id")) if isinstance(slot, dict) else ""
            if not _SLOT.fullmatch(slot_id):
                raise JobError("the platform sent a slot without a plain id")
            files = {}
            for end in ("start", "end"):
                leaf = _leaf(slot.get(end))
                files[end] = (folder / f"{slot_id}-{end}.safetensors", leaf)
                client.download(f"{base}/slots/{slot_id}/{end}/", files[end][0], sha256=leaf.state_sha256)
            ids.append(slot_id)
            segments.append(Segment(files["start"][0], files["start"][1], files["end"][0], files["end"][1]))
        measured = kind.measure(job.get("spec") or {}, data, segments, device=device or str(select_device()))
    body = sign_answer(key, job_id, key.address, [_entry(i, m) for i, m in zip(ids, measured, strict=True)])
    answered = client.request("POST", f"{base}/answer/", json=body)
    if answered.status_code != 202:
        log.error("verification job %s: the answer was refused: %s", job_id, answered.text[:300])
        return "refused"
    log.info("verification job %s answered (%d slots)", job_id, len(ids))
    return "answered"
