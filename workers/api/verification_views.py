"""The REST surface a verifier node uses for one verification job (worker token only):
GET the job, download the worker's data and each slot's two checkpoints, POST the signed
answer (workers/assignments/delegation.py). Every endpoint serves only the calling node's
own open job, and only the files that job names; anything else is reported missing.
"""

from __future__ import annotations

from django.core.files.storage import default_storage
from django.http import FileResponse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from config.downloads import download
from workers.api.assignment_views import WorkerAPIView
from workers.assignments import delegation


class VerificationView(WorkerAPIView):
    """The job: kind, spec, data link, and the slots' checkpoints with their hashes."""

    @extend_schema(responses={200: dict})
    def get(self, request: Request, job_id: str) -> Response:
        return Response(delegation.describe(delegation.for_verifier(self.worker, job_id)))


class VerificationDatasetView(WorkerAPIView):
    """The data the result's worker trained on (its worker-facing part)."""

    @extend_schema(responses={200: bytes})
    def get(self, request: Request, job_id: str) -> FileResponse:
        job = delegation.for_verifier(self.worker, job_id)
        data = delegation.data_file(job.assignment.task)
        if data is None:
            raise NotFound("This job's task has no dataset.")
        name, _, _, fmt = data
        return download(request, default_storage.open(name, "rb"), f"dataset.{fmt}")


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
