"""The REST surface a verifier node uses for one verification job (worker token only):
GET the job, download the worker's data and each slot's two checkpoints, POST the signed
answer (workers/assignments/delegation.py). Every endpoint serves only the calling node's
own open job, and only the files that job names; anything else is reported missing.
"""

from __future__ import annotations

from django.core.files.storage import default_storage
from django.http import FileResponse
from django.http.response import HttpResponseBase
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from config.downloads import download
from workers.api.assignment_views import WorkerAPIView, served
from workers.assignments import delegation


class VerificationView(WorkerAPIView):
    """The job: kind, spec, data link, and the slots' checkpoints with their hashes."""

    @extend_schema(responses={200: dict})
    def get(self, request: Request, job_id: str) -> Response:
        return Response(delegation.describe(delegation.for_verifier(self.worker, job_id)))


class VerificationDatasetView(WorkerAPIView):
    """The data the result's worker trained on (its worker-facing part), by ranges too;
    for a dataset in shards the manifest of its files."""

    @extend_schema(responses={200: bytes, 206: bytes, 416: None})
    def get(self, request: Request, job_id: str) -> HttpResponseBase:
        return served(request, delegation.served_data(delegation.for_verifier(self.worker, job_id), None))


class VerificationDatasetFileView(WorkerAPIView):
    """One file of the worker's data in shards, named by its manifest, by ranges too."""

    @extend_schema(operation_id="verifications_dataset_file_retrieve", responses={200: bytes, 206: bytes, 416: None})
    def get(self, request: Request, job_id: str, name: str) -> HttpResponseBase:
        return served(request, delegation.served_data(delegation.for_verifier(self.worker, job_id), name))


class VerificationSlotView(WorkerAPIView):
    """One end (``start`` or ``end``) of one slot's segment: a training-state checkpoint."""

    @extend_schema(responses={200: bytes})
    def get(self, request: Request, job_id: str, slot: str, end: str) -> FileResponse:
        job = delegation.for_verifier(self.worker, job_id)
        name = delegation.slot_file(job, slot, end)
        return download(request, default_storage.open(name, "rb"), f"{slot}-{end}.safetensors")


class VerificationAnswerView(WorkerAPIView):
    """The signed per-slot distances; the result's verification goes on once it is in."""

    @extend_schema(request=dict, responses={202: dict})
    def post(self, request: Request, job_id: str) -> Response:
        job = delegation.receive(self.worker, job_id, request.data)
        return Response({"state": job.state}, status=status.HTTP_202_ACCEPTED)
