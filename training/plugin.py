"""What a kind of task is, on both sides of the trust boundary.

A kind is a ``Kind`` in ``training/<family>/kind.py``: its name and texts, its spec (one
dataclass, ``training.specs``), what it needs
(resources, protocol features), what it costs in work (FLOPs), the datasets it takes, the
artifacts a run hands back and which of them make up a model, the training kind an
inference kind reads its model from, the platform's held-out split (``prepare``) and the
node's ``run``. Nothing here imports Django: the provider node looks kinds up in
``training.kinds`` and the platform (``marketplace.kinds``) adds pricing, validation and the verifier.

Most kinds take one of two roles, each declared with its helper so that what the role
shares is written once: ``training_kind`` (a model trained on a held-out split, handed back
as its files and metrics.json) and ``inference_kind`` (a model from an earlier task run on
uploaded inputs). A kind of neither, such as synthetic, is a plain ``Kind``.

A runner commits to its result by content hash: ``Outcome.result_hash`` is the sha256
(hex) of the artifact bytes the platform will verify. The proof is signed canonical JSON,
so it carries integers only: losses in micro-units, durations in microseconds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (step, total, metrics) → None: a run's progress as the node reports it.
Progress = Callable[[int, int, dict[str, float]], None]
# ``job["fetch"]``: the node's authenticated download, (server-relative url, destination) → None.
Fetch = Callable[[str, Path], None]
Spec = Mapping[str, Any]

MICRO = 1_000_000
GIB = 1024**3


@dataclass(frozen=True)
class Resources:
    """What a worker must offer to take a task."""

    memory_bytes: int
    gpu_preferred: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "gpu_preferred": self.gpu_preferred}


@dataclass(frozen=True)
class Outcome:
    """A finished job: the committed result hash, a proof object, and artifact files. A
    trained kind's ``checkpoints`` (artifact name → file) stay on the node, and only those
    the platform challenges are uploaded."""

    result_hash: str
    proof: dict[str, Any]
    artifacts: dict[str, Path]
    checkpoints: dict[str, Path] = field(default_factory=dict)


class DatasetProblem(ValueError):
    """A dataset a kind cannot take, said as the requester should read it (the platform
    answers it as a 400 on the ``dataset`` field)."""


class DataUnreadable(RuntimeError):
    """Part of the worker-facing data a kind's ``replay``, ``measure`` or ``canary`` reads
    could not be read: the platform's copy of the data, not the worker's result, so a
    verification that meets it cannot judge the result (never a rejection)."""


@dataclass(frozen=True)
class Upload:
    """A requester's stored dataset, as a kind's dataset check reads it."""

    name: str  # as the requester knows it
    path: Path
    format: str
    id: str
    sha256: str
    # The platform's readers of the formats it vetted at upload: a tensor's (shape, dtype
    # family), ValueError when unreadable; and the tensor's rows, memory-mapped.
    shape: Callable[[str], tuple[list[int], str]]
    array: Callable[[str], Any]
    # remember(key, compute): compute's JSON-able verdict, kept by the platform for a while
    # (the post form checks on every pause in typing; a large file takes seconds to read).
    remember: Callable[[str, Callable[[], Any]], Any]


# fn(spec, upload, source task's spec | None) -> None, or DatasetProblem: refuse, before a
# task is funded, a dataset its run or the platform's held-out split would refuse later.
CheckDataset = Callable[[Spec, Upload, Spec | None], None]

Runner = Callable[[dict[str, Any], Path, Progress], Outcome]
# fn(spec, upload path | None, out_dir, secret seed) -> (worker-facing file or folder | None,
# held-out file or folder): run on the platform once per task before scheduling; the worker
# then gets only the first (a folder file by file: ``SHARDED_DATASETS``) and the verifier
# scores on the second. The secret seed (32 bytes) is the
# platform's, keyed on the dataset's content (or, without one, on the task's spec) and never
# sent: the held-out draw follows from it alone, so every task on one dataset holds out the
# same rows and no worker can compute them. A ValueError names what is wrong with the data.
Prepare = Callable[[Spec, Path | None, Path, bytes], tuple[Path | None, Path]]
# The protocol feature of a node that downloads a folder of files (a manifest, then each
# file resumably by ranges; docs/provider-node.md): what a kind whose ``prepare`` writes
# folders needs, so an agent that only downloads single files is never offered its tasks.
SHARDED_DATASETS = "dataset:shards"
# The protocol feature of a node whose trainer re-executes as the platform's does: initial
# weights from ``training.portable``, every dropout mask from keys of the CPU generator
# (``training.asl.model.dropout``), mixed precision in bf16 (``training.device``). Every
# trained kind needs it. A node training as an earlier agent did would commit checkpoints
# that the platform's replay cannot reach, and would lose its pay and reputation for honest
# work. Raise the number whenever a change alters what a seed trains.
REPLAYABLE_TRAINING = "training:replay/2"
# The format a job names for such a folder (its URL serves the folder's manifest).
SHARDS_FORMAT = "shards"


@dataclass(frozen=True)
class Listed:
    """One file of a dataset in shards as its manifest lists it: the node checks the file
    against this size and sha256 when it downloads it."""

    name: str
    size_bytes: int
    sha256: str


# fetch(name, path): download the manifest's file ``name`` to ``path``, checked against its
# size and sha256 (the job fails, naming the file, when it differs).
FetchListed = Callable[[str, Path], None]
# fn(spec, folder, the manifest's files, fetch) -> None: take in a dataset in shards as it
# downloads, into ``folder`` (where the runner then finds it, as ``dataset.shards``), in place
# of the node's download of every file: a kind that reads each shard into a cache can delete
# it there, so the node never holds the raw dataset whole. Raising fails the job.
Ingest = Callable[[Spec, Path, Sequence[Listed], FetchListed], None]
# fn(spec, the worker-facing data prepare wrote, file or folder (None: synthetic), challenged segments)
# -> per segment, "" when its re-execution lands on its committed end, else the reason a
# requester reads (``training.replay.check_segments``); keyword ``device`` (default "cpu").
# DataUnreadable when the data cannot be read.
Replay = Callable[..., list[str]]
# fn(spec, worker's data, segments, *, device) -> per segment, how far its committed end lies
# from its re-execution in steps' updates, or why it cannot be re-executed: what a verifier
# node reports in delegated re-execution (``training.replay.measure_segments``).
Measure = Callable[..., list[float | str]]
# fn(spec, the worker-facing data file, a challenged segment (its committed checkpoints), out,
# *, device) -> the sha256 of the weights of the canary written to ``out``: the segment
# trained again from its start with some steps on another step's rows, a genuine state far
# enough from the committed end that an honest re-execution fails it
# (``training.replay.canary_state``). ValueError or ArtifactError when none can be made.
Canary = Callable[..., str]


@dataclass(frozen=True)
class TrainingPlan:
    """What a run of a spec on the worker's data must do, as the platform checks a trace
    against it: the weights its checkpoint 0 must hold, and its optimizer steps."""

    untrained_sha256: str
    steps_per_epoch: int
    epochs: int
    early_stopping_patience: int  # 0: off
    every: int  # optimizer steps between checkpoints of its trace (``training.trace.trace_every``)

    @property
    def total_steps(self) -> int:
        """The optimizer steps of a run that trains every epoch."""
        return self.steps_per_epoch * self.epochs

    @property
    def least_steps(self) -> int:
        """The fewest optimizer steps a run may end after: every epoch, or with early stopping
        on, the patience plus the first epoch (which always improves)."""
        epochs = self.epochs
        if self.early_stopping_patience:
            epochs = min(epochs, self.early_stopping_patience + 1)
        return self.steps_per_epoch * epochs


# fn(spec, worker-facing data file or folder | None) -> the run's TrainingPlan.
Plan = Callable[[Spec, Path | None], TrainingPlan]


def _never(spec: Spec) -> bool:
    return False


def always(spec: Spec) -> bool:
    """``dataset_required`` of a kind that always takes a dataset."""
    return True


def inference_flops(spec: Spec) -> float:
    """The work an inference task is priced at: one model's forward passes, a flat 5e11."""
    return 5e11


def inference_resources(spec: Spec) -> Resources:
    """An inference task's needs: one model in 1 GiB, a CPU will do."""
    return Resources(memory_bytes=GIB, gpu_preferred=False)


def _no_features(spec: Spec) -> tuple[str, ...]:
    return ()


def _as_given(spec: Spec, capabilities: Mapping[str, Any]) -> Spec:
    return spec


def _no_problems(spec: Spec) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Kind:
    """One kind of task, as both sides of the trust boundary know it."""

    name: str
    label: str
    description: str
    # The spec: a frozen dataclass of ``training.specs.param`` fields (bounds, defaults, help).
    spec: type
    resources: Callable[[Spec], Resources]
    flops: Callable[[Spec], float]
    run: Runner
    artifacts: tuple[str, ...]
    dataset_formats: tuple[str, ...] = ()
    dataset_required: Callable[[Spec], bool] = _never
    # The artifacts that make up the trained model, served to inference tasks built on it.
    model_files: tuple[str, ...] = ()
    # The training kind whose completed task an inference spec names in ``source_task``.
    source_kind: str | None = None
    prepare: Prepare | None = None
    check_dataset: CheckDataset | None = None
    # Protocol features a worker must list in its capabilities to run this spec (for a
    # change a node cannot follow silently, such as how the synthetic matrices are drawn).
    features: Callable[[Spec], tuple[str, ...]] = _no_features
    # fn(spec, a node's registered capabilities) -> the spec as that node runs it: what the
    # spec leaves to the node's hardware (an ASL batch_size of 0) fixed, so the node is sent
    # it and its result is checked against it (the platform's plan and replay).
    node_spec: Callable[[Spec, Mapping[str, Any]], Spec] = _as_given
    # fn(spec with defaults filled in) -> {field: why}: the rules between fields that their
    # bounds cannot say; the platform refuses such a spec (400) naming each field.
    check_spec: Callable[[Spec], dict[str, str]] = _no_problems
    # A trained kind's proof of training: re-execute segments of its trace (training.trace),
    # and what its trace must start from and span.
    replay: Replay | None = None
    plan: Plan | None = None
    # Delegated re-execution (docs/proof-of-training.md): a verifier node's measure, and the
    # platform's canary. A kind without both is re-executed on the platform only.
    measure: Measure | None = None
    canary: Canary | None = None
    # How a node takes in a dataset in shards (``Ingest``); None: it downloads every file.
    ingest: Ingest | None = None


class UnsupportedKind(Exception):
    """A job of a kind this node has no plug-in for."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def micro(value: Any) -> int:
    """A float metric as signed-JSON-safe integer micro-units."""
    return round(float(value) * MICRO)


def model_dir(job: dict[str, Any], workdir: Path, files: tuple[str, ...]) -> Path:
    """Fetch the source task's model files over the node's authenticated download."""
    fetch: Fetch | None = job.get("fetch")
    if fetch is None:
        raise RuntimeError(f"{job['kind']} needs the node's authenticated download (job['fetch']).")
    folder = workdir / "source-model"
    folder.mkdir()
    for name in files:
        fetch(f"/api/v1/assignments/{job['id']}/model/{name}/", folder / name)
    return folder


def numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a trainer's metrics, as the floats progress reports carry."""
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float)}


# The weights a training run commits to (``Outcome.result_hash``), and the file of its figures.
WEIGHTS = "model.safetensors"
METRICS = "metrics.json"
# Where a training run writes its trace (``training.trace``), under its workdir.
TRACE_DIR = "trace"


def trace_dir(workdir: Path) -> Path:
    """The folder a trained kind's ``train`` writes its training trace into."""
    return Path(workdir) / TRACE_DIR


# fn(job, workdir, out_dir, progress) -> the proof: train into out_dir, which then holds
# the model's files and metrics.json, writing the training trace into ``trace_dir(workdir)``.
Train = Callable[[dict[str, Any], Path, Path, Progress], dict[str, Any]]


@dataclass(frozen=True)
class Datasets:
    """The datasets a kind takes: their formats, whether a spec needs one, the pure check
    that refuses one before a task is funded, the platform's held-out split, and how a node
    takes in the split's worker share when it comes in shards."""

    formats: tuple[str, ...]
    required: Callable[[Spec], bool] = always
    check: CheckDataset | None = None
    prepare: Prepare | None = None
    ingest: Ingest | None = None

    def kind_fields(self) -> dict[str, Any]:
        """The datasets as a ``Kind``'s fields."""
        return {
            "dataset_formats": self.formats,
            "dataset_required": self.required,
            "check_dataset": self.check,
            "prepare": self.prepare,
            "ingest": self.ingest,
        }


def training_kind(
    *,
    name: str,
    label: str,
    description: str,
    spec: type,
    datasets: Datasets,
    model_files: tuple[str, ...],
    train: Train,
    resources: Callable[[Spec], Resources],
    flops: Callable[[Spec], float],
    check_spec: Callable[[Spec], dict[str, str]] = _no_problems,
    features: Callable[[Spec], tuple[str, ...]] = _no_features,
    node_spec: Callable[[Spec, Mapping[str, Any]], Spec] = _as_given,
    replay: Replay | None = None,
    plan: Plan | None = None,
    measure: Measure | None = None,
    canary: Canary | None = None,
) -> Kind:
    """A kind that trains a model: ``train`` writes ``model_files`` (``WEIGHTS`` among them)
    and metrics.json into ``<workdir>/model`` and its training trace into
    ``trace_dir(workdir)``; the run commits to the weights and to the trace
    (``proof["trace"]``, the Merkle root of its checkpoints), hands back those files and
    trace.json, and keeps the checkpoints on the node (``Outcome.checkpoints``)."""
    from training.trace import TRACE_FILE, checkpoint_name, read_trace

    artifacts = (*model_files, METRICS, TRACE_FILE)

    def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
        out_dir = workdir / "model"
        proof = train(job, workdir, out_dir, progress)
        traced = trace_dir(workdir)
        trace = read_trace(traced / TRACE_FILE)
        files = {file: out_dir / file for file in (*model_files, METRICS)}
        files[TRACE_FILE] = traced / TRACE_FILE
        checkpoints = {checkpoint_name(leaf.index): traced / checkpoint_name(leaf.index) for leaf in trace.leaves}
        proof = {**proof, "trace": trace.commitment()}
        return Outcome(sha256_file(out_dir / WEIGHTS), proof, files, checkpoints)

    return Kind(
        name=name,
        label=label,
        description=description,
        spec=spec,
        model_files=model_files,
        resources=resources,
        flops=flops,
        run=run,
        artifacts=artifacts,
        check_spec=check_spec,
        features=lambda spec: (*features(spec), REPLAYABLE_TRAINING),
        node_spec=node_spec,
        replay=replay,
        plan=plan,
        measure=measure,
        canary=canary,
        **datasets.kind_fields(),
    )


# fn(job, workdir, downloaded dataset, source model folder, progress) -> (output file in
# workdir, proof): run the source task's model on the job's inputs.
Predict = Callable[[dict[str, Any], Path, Path, Path, Progress], tuple[Path, dict[str, Any]]]


def inference_kind(
    *,
    name: str,
    label: str,
    description: str,
    spec: type,
    datasets: Datasets,
    source: Kind,
    inputs: str,
    predict: Predict,
    output: str,
) -> Kind:
    """A kind that runs the model of a completed ``source`` task (named by the spec's
    ``source_task``) on a dataset of ``inputs``: the run fetches the model's files over the
    node's authenticated download, commits to the ``output`` file ``predict`` writes and
    hands it back. Priced and sized as inference (``inference_flops``, ``inference_resources``)."""

    def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
        if job.get("fetch") is None:
            raise RuntimeError(f"{name} needs the node's authenticated download (job['fetch']).")
        if not job.get("dataset"):
            raise RuntimeError(f"{name} needs a dataset of {inputs}.")
        model = model_dir(job, workdir, source.model_files)
        path, proof = predict(job, workdir, workdir / f"dataset.{job['dataset']['format']}", model, progress)
        return Outcome(sha256_file(path), proof, {output: path})

    return Kind(
        name=name,
        label=label,
        description=description,
        spec=spec,
        source_kind=source.name,
        resources=inference_resources,
        flops=inference_flops,
        run=run,
        artifacts=(output,),
        **datasets.kind_fields(),
    )
