"""A rehearsal of the ISLR competition's training set on the platform, in real processes.

1. Generates a set shaped like the competition's (``training.asl.synthetic``: 94,477
   sequences of 250 signs by 21 participants, lengths from ``ISLR_LENGTHS``) times
   ``--scale``: every sign and participant at every scale the count allows, fewer
   sequences per pair; one zip, made by one process per core.
2. Starts the platform as ``bench/dispatch.py`` does (daphne, one platform Celery worker on
   the ``platform`` and ``control`` queues, a fresh SQLite database under the work folder,
   the embedded filesystem broker or Redis/RabbitMQ when configured) and one node, registered
   with the real CLI.
3. Posts the zip through the REST API in parts (``/api/v1/dataset-uploads/``), then an
   ``asl_training`` task of one epoch on it (``SPEC``: the smallest model the platform
   offers, dim 192 and one block, on 32 frames), and waits for the platform's held-out split,
   the node's download, cache and epoch, and the verification.

Stage times come from the bench's own clock (generate, upload, post) and the assignment's
timestamps (split: post answered → assignment made; node: started → first progress (its
download, and its cache filled as each shard arrives) → result submitted; verify:
submitted → settled). A sampler reads, every half second, the resident memory of each
process and its children (/proc, summed over the tree) and the bytes on disk in each area:

- ``generated``: the generated zip, whose blocks are released part by part as the platform
  takes them (``release``), so the dataset is on the disk once during the upload;
- ``upload``: the media folder's ``dataset-uploads/`` and ``datasets/`` (parts, then the dataset);
- ``platform``: the media folder's ``prepared/`` and the platform worker's TMPDIR (the split);
- ``artifacts``: the media folder's ``artifacts/`` (the model, and the checkpoints the
  proof of training asked for);
- ``node``: the node's TMPDIR (its download, cache and checkpoints).

Each area's peak, the largest sum of the areas in one sample (``disk_total_peak_bytes``,
the run's real peak) and the disk's own use over its use at the start are reported.
Each process gets its own TMPDIR under the work folder. The peak is the largest sample, so
a spike shorter than half a second may be missed; ``hwm`` adds each process's VmHWM read
just before it stops (its own peak; children that exited earlier are not in it). Resident
memory counts the pages of memory-mapped files (the node's cache is one), which the kernel
can drop; ``peak_anon_rss_bytes`` is the peak without them. The web process's peak is also
kept per phase: the upload, the post, and the run (the node's download is served then).

Before anything is written, the disk the run holds at once is estimated (``disk_needed``:
``DISK_FACTOR`` × the estimated dataset size, and the checkpoints) and the bench refuses to
start when that and ``DISK_RESERVE`` are more than the disk has free.

``--node-memory 4`` runs the node's process tree in a memory cgroup capped at 4 GiB (root,
cgroup v1 or v2): the kernel charges it its anonymous memory and the page cache of its
files (the memory-mapped cache among them), reclaims those pages within the cap, and kills
the node if what it cannot reclaim passes it. Its resident peak then says how much RAM the
node used because it was there; the cap says what it needs.

Prints one JSON line: the stages' seconds, peaks, disk, the task's outcome, linear
estimates for the full set, and the target (the node's work in 4 GiB: under the cap, never
killed and verified; uncapped, its resident peak).
``.venv/bin/python bench/asl_scale.py [--scale 0.01] [--workdir DIR] [--keep] [--node-memory GiB]``
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.asl.synthetic import ISLR_PARTICIPANTS, ISLR_SEQUENCES, ISLR_SIGNS, generate  # noqa: E402

GIB = 1024**3
NODE_TARGET_BYTES = 4 * GIB
# Zip bytes a sequence takes at ISLR_LENGTHS (529,330 to 543,821 measured at 0.1 to 0.01).
BYTES_PER_SEQUENCE_ESTIMATE = 560_000
# The disk the run holds at once, over the dataset's size: the dataset once (the generated
# zip gives its blocks up as the upload takes them; the platform's shares are recipes over
# the upload), the node's cache and the platform's for its re-execution (0.09 each at 0.1).
DISK_FACTOR = 1.25
# Plus the trace checkpoints: on the node, one every k steps of the run (the segment rule,
# ``training.trace.trace_every``: from about 730 for a long run to one a step, up to about
# 1,450, for a shorter one), and those the platform keeps; a training state at SPEC's model
# takes 14.6 MiB.
STATE_BYTES = 15_300_000
# What the disk keeps free beyond the estimate.
DISK_RESERVE = 4 * GIB
SPEC: dict[str, Any] = {
    "dim": 192,
    "blocks": 1,
    "max_len": 32,
    "epochs": 1,
    "batch_size": 16,
    "grad_accumulation": 1,
    "learning_rate": 3e-3,
    "validation_fraction": 0.1,
    "seed": 0,
}
SAMPLE_S = 0.5


def checkpoints_needed(sequences: int, batch: int, epochs: int) -> int:
    """The trace checkpoints a run of ``epochs`` on ``sequences`` in batches of ``batch``
    writes: the worker's share (the held-out participants out, the validation tenth out)
    in optimizer steps, one checkpoint every ``trace_every`` of them and at each epoch's end."""
    from training.asl.split import HELDOUT_FRACTION
    from training.trace import trace_every

    held = math.ceil(HELDOUT_FRACTION * ISLR_PARTICIPANTS)  # the split's rule (``heldout_participants``)
    train = sequences * (ISLR_PARTICIPANTS - held) / ISLR_PARTICIPANTS * (1 - SPEC["validation_fraction"])
    steps = max(1, math.ceil(train / batch)) * epochs
    return math.ceil(steps / trace_every(steps)) + epochs + 1


def disk_needed(sequences: int, batch: int = SPEC["batch_size"], epochs: int = 1) -> int:
    """The bytes the run holds on its disk at once, estimated before anything is written."""
    data = DISK_FACTOR * sequences * BYTES_PER_SEQUENCE_ESTIMATE
    return round(data + checkpoints_needed(sequences, batch, epochs) * STATE_BYTES)


# --- What the sampler reads -----------------------------------------------------------


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _kib(value: str | None) -> int:
    return int(value.split()[0]) * 1024 if value else 0


def tree(root: int) -> list[int]:
    """``root`` and its descendants now alive."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            ppid = _status(int(entry.name)).get("PPid")
            if ppid:
                children.setdefault(int(ppid), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_rss(root: int, field: str = "VmRSS") -> int:
    """The tree's resident memory (``RssAnon``: without mapped files' pages)."""
    return sum(_kib(_status(pid).get(field)) for pid in tree(root))


def tree_hwm(root: int) -> int:
    """The largest VmHWM among the tree's living processes."""
    return max((_kib(_status(pid).get("VmHWM")) for pid in tree(root)), default=0)


def folder_bytes(*folders: Path, skip: Callable[[Path], bool] = lambda path: False) -> int:
    """Bytes of the files under ``folders``, each file once (a hard link is not a copy)."""
    seen: dict[tuple[int, int], int] = {}
    for folder in folders:
        if folder.is_file():
            stat = folder.stat()
            seen[stat.st_dev, stat.st_ino] = min(stat.st_size, stat.st_blocks * 512)
        for dirpath, _, files in os.walk(folder):
            for name in files:
                path = Path(dirpath) / name
                if skip(path):
                    continue
                try:
                    stat = path.lstat()  # a link (the upload, linked where it is read) is no copy
                except OSError:
                    continue
                # Blocks on disk, not the size: the generated zip is released as it is uploaded.
                seen[stat.st_dev, stat.st_ino] = min(stat.st_size, stat.st_blocks * 512)
    return sum(seen.values())


class Sampler(threading.Thread):
    """Peaks of each process tree's memory and each disk area's bytes, every SAMPLE_S."""

    def __init__(self, areas: dict[str, list[Path]], node_tmp: Path) -> None:
        super().__init__(daemon=True, name="sampler")
        self.areas, self.node_tmp = areas, node_tmp
        self.roots: dict[str, int] = {}
        self.rss: dict[str, int] = {}
        self.anon: dict[str, int] = {}
        self.phase = "start"  # what the bench is waiting for; the web's peak is kept per phase
        self.web_phases: dict[str, int] = {}
        self.disk: dict[str, int] = {}
        self.disk_total = 0  # the largest sum of the areas in one sample: the run's real peak
        self.fs_start = shutil.disk_usage(node_tmp).used
        self.fs_peak = 0  # the disk's use over its use at the start, at its largest
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        for role, pid in list(self.roots.items()):
            rss = tree_rss(pid)
            self.rss[role] = max(self.rss.get(role, 0), rss)
            self.anon[role] = max(self.anon.get(role, 0), tree_rss(pid, "RssAnon"))
            if role == "web":
                self.web_phases[self.phase] = max(self.web_phases.get(self.phase, 0), rss)
        total = 0
        for area, folders in self.areas.items():
            held = folder_bytes(*folders)
            self.disk[area] = max(self.disk.get(area, 0), held)
            total += held
        self.disk_total = max(self.disk_total, total)
        self.fs_peak = max(self.fs_peak, shutil.disk_usage(self.node_tmp).used - self.fs_start)


# --- The run ----------------------------------------------------------------------------


class MemoryCap:
    """A memory cgroup of its own for the node's process tree, capped at ``limit`` bytes:
    the kernel reclaims the tree's file pages (its memory-mapped cache, what it writes)
    within the cap, and kills it if what it cannot reclaim passes it. Cgroup v2 where the
    memory controller is there, else v1's memory hierarchy; None where neither can be
    written (not root, no cgroup file system)."""

    def __init__(self, path: Path, version: int, limit: int) -> None:
        self.path, self.version, self.limit = path, version, limit

    @classmethod
    def make(cls, name: str, limit: int) -> MemoryCap | None:
        v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
        try:
            if "memory" in (v2 / "cgroup.controllers").read_text().split():
                (v2 / name).mkdir()
                (v2 / name / "memory.max").write_text(str(limit))
                (v2 / name / "memory.swap.max").write_text("0")
                return cls(v2 / name, 2, limit)
        except OSError:
            pass
        try:
            (v1 / name).mkdir()
            (v1 / name / "memory.limit_in_bytes").write_text(str(limit))
            return cls(v1 / name, 1, limit)
        except OSError:
            return None

    def add(self, pid: int) -> None:
        """Move ``pid`` (and the children it starts from now on) into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def peak(self) -> int:
        """The most the tree was charged at once: anonymous memory and page cache."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return 0

    def oom_kills(self) -> int:
        """Processes the kernel killed for passing the cap."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            fields = dict(line.split() for line in (self.path / name).read_text().splitlines() if line.strip())
        except (OSError, ValueError):
            return 0
        return int(fields.get("oom_kill", 0))

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # a process still in it: left for the next boot
            self.path.rmdir()


def setup_django(var_dir: Path) -> None:
    os.environ["PROOFWORK_VAR_DIR"] = str(var_dir)
    os.environ.pop("DATABASE_URL", None)  # a fresh SQLite file under the work folder
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("PROOFWORK_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def release(handle: Any, start: int, length: int) -> bool:
    """Give the disk blocks of ``length`` bytes at ``start`` of an open file back to the
    filesystem, the file keeping its size (``fallocate`` with FALLOC_FL_PUNCH_HOLE): the
    generated zip shrinks on disk as its parts reach the platform, so the dataset is on the
    disk once, not twice. False where the filesystem cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "fallocate"):  # Linux's; elsewhere the zip keeps its blocks
        return False
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    punch_hole, keep_size = 0x02, 0x01
    return libc.fallocate(handle.fileno(), punch_hole | keep_size, start, length) == 0


def upload_in_parts(client: Any, path: Path, release_sent: bool = True) -> tuple[str, int]:
    """The dataset's id, through /api/v1/dataset-uploads/; and the parts it took. With
    ``release_sent``, each part's blocks of the file are released once the platform took it."""
    size = path.stat().st_size
    begun = client.post("/api/v1/dataset-uploads/", json={"size_bytes": size, "name": path.name})
    assert begun.status_code == 201, begun.text
    upload_id, part = begun.json()["id"], int(begun.json()["part_bytes"])
    parts = 0
    with path.open("r+b") as data:
        for start in range(0, size, part):
            data.seek(start)
            chunk = data.read(part)
            end = start + len(chunk) - 1
            headers = {"Content-Range": f"bytes {start}-{end}/{size}", "Content-Type": "application/octet-stream"}
            answer = client.put(f"/api/v1/dataset-uploads/{upload_id}/", content=chunk, headers=headers)
            parts += 1
            if answer.status_code in (201, 202) and release_sent:
                release_sent = release(data, start, len(chunk))
            if end + 1 < size:
                assert answer.status_code == 202, answer.text
            else:
                assert answer.status_code == 201, answer.text
                return str(answer.json()["id"]), parts
    raise AssertionError("the upload never completed")


def run(
    scale: float,
    workdir: Path,
    processes: int,
    timeout: float,
    signs: int = ISLR_SIGNS,
    epochs: int = 1,
    batch: int = SPEC["batch_size"],
    node_memory: int = 0,
) -> dict[str, Any]:
    """The whole rehearsal in ``workdir``; the summary ``main`` prints. ``node_memory``
    bytes, when given, cap the node's process tree (``MemoryCap``)."""
    sequences = max(1, round(ISLR_SEQUENCES * scale))
    spec = {**SPEC, "epochs": epochs, "batch_size": batch}
    needed, free = disk_needed(sequences, batch, epochs), shutil.disk_usage(workdir).free
    if needed + DISK_RESERVE > free:
        raise SystemExit(
            f"refused: {sequences} sequences need about {needed / GIB:.1f} GiB of disk at once, and {workdir}'s"
            f" disk has {free / GIB:.1f} GiB free ({DISK_RESERVE / GIB:.0f} GiB are kept spare)"
        )
    stages: dict[str, float | None] = {}

    t0 = time.monotonic()
    zip_path = generate(
        workdir / "islr.zip",
        n_signs=signs,
        n_participants=ISLR_PARTICIPANTS,
        sequences=sequences,
        lengths="islr",
        processes=processes,
        as_zip=True,
    )
    stages["generate"] = time.monotonic() - t0
    dataset_bytes = zip_path.stat().st_size

    # The platform's limit, raised for this dataset, and every process's scratch space in
    # the work folder; children inherit this environment.
    os.environ["PROOFWORK_DATASET_MAX_BYTES"] = str(max(dataset_bytes, 512 * 1024**2))
    os.environ["PROOFWORK_ASSIGNMENT_DEADLINE"] = str(max(3600, int(timeout)))
    media = workdir / "var" / "media"
    tmp = {role: workdir / f"tmp-{role}" for role in ("web", "platform", "node")}
    for folder in tmp.values():
        folder.mkdir(parents=True, exist_ok=True)
    setup_django(workdir / "var")

    import httpx

    from ledger import services as ledger
    from ledger.units import UNITS_PER_CREDIT
    from marketplace.models import Task, TaskStatus, User
    from marketplace.services import create_api_token
    from tests.workers import processes as p
    from workers.models import Assignment, Worker

    provider = User.objects.create_user("bench-provider", "provider@example.com", "bench-password-1")
    requester = User.objects.create_user("bench-requester", "requester@example.com", "bench-password-1")
    ledger.deposit(requester, 10_000 * UNITS_PER_CREDIT, reference="bench-deposit")
    _, token = create_api_token(requester, "bench")

    sampler = Sampler(
        {
            "generated": [zip_path],
            "upload": [media / "dataset-uploads", media / "datasets"],
            "platform": [media / "prepared", tmp["platform"]],
            "artifacts": [media / "artifacts"],
            "node": [tmp["node"]],
        },
        tmp["node"],
    )
    hwm: dict[str, int] = {}
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    platform_args = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "platform,control"]
    platform_args += ["--pool", "solo", "-n", f"bench-platform-{os.getpid()}@%h", "--loglevel", "INFO"]
    env = {role: p.child_env(DJANGO_SETTINGS_MODULE="config.settings", TMPDIR=str(tmp[role])) for role in tmp}
    env["node"].pop("DJANGO_SETTINGS_MODULE")
    with (
        p.daphne(logs, env["web"]) as url,
        p.spawn(platform_args, logs / "platform.log", env["platform"]) as platform,
    ):
        key = p.register_agent(logs, url, provider, "bench")
        worker = Worker.objects.get(owner=provider)
        web_pid = next(pid for pid in tree(os.getpid()) if "daphne" in _cmdline(pid))
        cap = MemoryCap.make(f"proofwork-asl-scale-{os.getpid()}", node_memory) if node_memory else None
        if node_memory and cap is None:
            raise SystemExit("--node-memory: no memory cgroup can be made here (cgroup v1 or v2, as root)")
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), logs / "agent.log", env["node"]) as agent:
            if cap is not None:
                cap.add(agent.pid)  # before it has started any job
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 120, "the node never came online")
            sampler.roots = {"web": web_pid, "platform": platform.pid, "node": agent.pid}
            sampler.start()
            with httpx.Client(base_url=url, headers={"Authorization": f"Token {token}"}, timeout=600) as client:
                t0 = time.monotonic()
                sampler.phase = "upload"
                dataset_id, parts = upload_in_parts(client, zip_path)
                stages["upload"] = time.monotonic() - t0

                t0 = time.monotonic()
                sampler.phase = "post"
                body = {"kind": "asl_training", "spec": spec, "dataset": dataset_id, "budget": "1000"}
                posted = client.post("/api/v1/tasks/", json=body)
                assert posted.status_code == 201, posted.text
                stages["post"] = time.monotonic() - t0
                posted_at = time.time()
            task_id = posted.json()["id"]
            sampler.sample()
            sampler.phase = "run"

            def settled() -> bool:
                # Settled, or its one node's result judged: a rejected one waits for another node.
                ended = (Assignment.State.ACCEPTED, Assignment.State.REJECTED, Assignment.State.EXPIRED)
                return (
                    Task.objects.get(pk=task_id).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)
                    or Assignment.objects.filter(task_id=task_id, state__in=ended).exists()
                )

            def explain() -> str:
                task = Task.objects.get(pk=task_id)
                states = list(Assignment.objects.filter(task=task).values_list("state", "reason"))
                return f"task {task.status} ({task.status_reason}); assignments {states}"

            p.wait_for(settled, timeout, "the task did not settle in time", interval=1.0, explain=explain)
            # An accepted result completes the task just after (settlement); a rejected one
            # leaves it open for another node, and the summary says why.
            if Assignment.objects.filter(task_id=task_id, state=Assignment.State.ACCEPTED).exists():
                p.wait_for(lambda: Task.objects.get(pk=task_id).status != TaskStatus.OPEN, 30, "", explain=explain)
            sampler.sample()
            hwm = {"web": tree_hwm(web_pid), "platform": tree_hwm(platform.pid), "node": tree_hwm(agent.pid)}
            sampler.halt.set()
            disk_final = {area: folder_bytes(*folders) for area, folders in sampler.areas.items()}
            p.stop(agent, platform)
        capped = {"peak": cap.peak(), "oom_kills": cap.oom_kills()} if cap is not None else {}
        if cap is not None:
            cap.remove()
        from django.conf import settings

        if settings.NODE_BROKER_URL:
            from workers.assignments import nodebroker

            nodebroker.remove_node(worker.address)  # the bench's node user and queue

    task = Task.objects.get(pk=task_id)
    assignment = Assignment.objects.filter(task=task).order_by("created_at").last()
    history = assignment.history if assignment else []
    first_step = min((float(point["t"]) for point in history if "t" in point), default=None)

    def at(value: Any) -> float | None:
        return value.timestamp() if value is not None else None

    made, started = at(assignment and assignment.created_at), at(assignment and assignment.started_at)
    submitted, settled_at = at(assignment and assignment.submitted_at), at(assignment and assignment.settled_at)

    def span(a: float | None, b: float | None) -> float | None:
        return b - a if a is not None and b is not None else None

    stages.update(
        {
            "split": span(posted_at, made),  # the platform's held-out split, and scheduling
            # The node's download, and its cache of the 118 points as each shard arrives.
            "node_until_first_step": span(started, first_step),
            "train": span(first_step, submitted),  # one epoch, and the node's own validation
            "verify": span(submitted, settled_at),
            "post_to_settled": span(posted_at, settled_at),
        }
    )
    stages = {name: round(value, 1) if value is not None else None for name, value in stages.items()}
    summary = task.result_summary or {}
    factor = ISLR_SEQUENCES / sequences
    timed = ("generate", "upload", "post", "split", "node_until_first_step", "train", "verify")
    return {
        "bench": "asl_scale",
        "scale": scale,
        "sequences": sequences,
        "signs": signs,
        "participants": ISLR_PARTICIPANTS,
        "dataset_bytes": dataset_bytes,
        "bytes_per_sequence": round(dataset_bytes / sequences),
        "upload_parts": parts,
        "spec": spec,
        "task_status": task.status,
        "task_reason": task.status_reason,
        "assignment_state": assignment.state if assignment else None,
        "assignment_reason": assignment.reason if assignment else None,
        "heldout_sequences": summary.get("heldout_sequences"),
        "heldout_top1": summary.get("heldout_top1"),
        "stages_s": stages,
        "peak_rss_bytes": sampler.rss,
        "peak_anon_rss_bytes": sampler.anon,
        "web_peak_rss_by_phase": sampler.web_phases,
        "hwm_bytes": hwm,
        "disk_peak_bytes": sampler.disk,
        "disk_total_peak_bytes": sampler.disk_total,
        "filesystem_used_peak_bytes": sampler.fs_peak,
        "disk_final_bytes": disk_final,
        "full_scale_linear": {
            "dataset_bytes": round(dataset_bytes * factor),
            "disk_total_peak_bytes": round(sampler.disk_total * factor),
            "stages_s": {name: round(value * factor) for name in timed if (value := stages.get(name)) is not None},
        },
        "target_node_peak_bytes": NODE_TARGET_BYTES,
        # Under a cap: what the kernel charged the node's tree at most (its anonymous memory
        # and the page cache of its files, reclaimed within the cap), and its OOM kills.
        "node_memory_limit_bytes": node_memory or None,
        "node_cgroup_peak_bytes": capped.get("peak"),
        "node_oom_kills": capped.get("oom_kills"),
        # The node did its work in NODE_TARGET_BYTES: run under that cap, it was never
        # killed and its result verified; or, uncapped, its resident peak stayed under it.
        "node_ok": (
            node_memory <= NODE_TARGET_BYTES and capped["oom_kills"] == 0 and task.status == TaskStatus.COMPLETED
            if capped
            else max(sampler.rss.get("node", 0), hwm.get("node", 0)) <= NODE_TARGET_BYTES
        ),
        "verified": task.status == TaskStatus.COMPLETED,
    }


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 94,477 sequences (default 1)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the files go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, data) afterwards")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="generating processes")
    parser.add_argument("--timeout", type=float, default=0, help="seconds to wait for the task (default: by scale)")
    parser.add_argument("--signs", type=int, default=ISLR_SIGNS, help=f"signs (default {ISLR_SIGNS})")
    parser.add_argument("--epochs", type=int, default=1, help="training epochs (default 1)")
    parser.add_argument("--batch", type=int, default=SPEC["batch_size"], help="the task's batch size (default 16)")
    parser.add_argument(
        "--node-memory",
        type=float,
        default=0,
        help="GiB the node's process tree may use, enforced by a memory cgroup (needs root; default: no cap)",
    )
    args = parser.parse_args()
    if args.node_memory < 0:
        parser.error("--node-memory: GiB, 0 for no cap")
    if not 0 < args.scale <= 1:
        parser.error("--scale: a fraction in (0, 1]")
    # Stopped from outside: unwind, so that the processes it started are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="proofwork-asl-scale-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    timeout = args.timeout or 600 + 0.5 * ISLR_SEQUENCES * args.scale
    try:
        result = run(
            args.scale,
            workdir,
            max(1, args.processes),
            timeout,
            args.signs,
            args.epochs,
            args.batch,
            round(args.node_memory * GIB),
        )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result))
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
