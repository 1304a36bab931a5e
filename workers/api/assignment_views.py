"""The REST surface a provider node uses for one assignment (worker token only).

GET the job, download its dataset (and, for inference, its model), say it started,
upload artifacts, submit the signed ComputeResult. Every endpoint checks the assignment
belongs to the calling worker; a foreign one is reported missing.
"""

from __future__ import annotations

from typing import Any

from django.core.files.storage import default_storage
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import parsers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api.uploads import OutOfOrder
from config.downloads import ranged_download
from config.serializers import refuse_body
from workers.assignments import jobs
from workers.identity.authentication import IsWorker, WorkerTokenAuthentication
from workers.models import Assignment, Worker


class WorkerAPIView(APIView):
    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]

    @property
    def worker(self) -> Worker:
        assert isinstance(self.request.auth, Worker)
        return self.request.auth

    def assignment(self, assignment_id: Any) -> Assignment:
        found = (
            Assignment.objects.select_related("task", "task__dataset", "worker")
            .filter(pk=assignment_id, worker=self.worker)
            .first()
        )
        if found is None:
            raise NotFound("No such assignment for this worker.")
        return found


class AssignmentView(WorkerAPIView):
    """The job: kind, spec, seed material, dataset link, deadline."""

    @extend_schema(responses={200: dict})
    def get(self, request: Request, assignment_id: str) -> Response:
        return Response(jobs.describe(self.assignment(assignment_id)))


def served(request: Request, what: jobs.ServedFile | bytes) -> HttpResponseBase:
    """The response for a dataset a node downloads: a folder's manifest, or the file by ranges."""
    if isinstance(what, bytes):  # a folder's manifest
        return HttpResponse(what, content_type="application/json")
    return ranged_download(request, what.open(), what.filename, what.size)


class AssignmentDatasetView(WorkerAPIView):
    """The task's dataset (only to the assigned worker): its bytes, by ranges too, or for a
    dataset in shards the manifest of its files."""

    @extend_schema(responses={200: bytes, 206: bytes, 416: None})
    def get(self, request: Request, assignment_id: str) -> HttpResponseBase:
        return served(request, jobs.served_dataset(self.assignment(assignment_id)))


class AssignmentDatasetFileView(WorkerAPIView):
    """One file of a dataset in shards, named by its manifest (only to the assigned
    worker), by ranges too."""

    @extend_schema(operation_id="assignments_dataset_file_retrieve", responses={200: bytes, 206: bytes, 416: None})
    def get(self, request: Request, assignment_id: str, name: str) -> HttpResponseBase:
        return served(request, jobs.served_dataset(self.assignment(assignment_id), name))


class AssignmentModelView(WorkerAPIView):
    """One file of the trained model an inference assignment runs (only to its worker), by ranges too."""

    @extend_schema(responses={200: bytes, 206: bytes, 416: None})
    def get(self, request: Request, assignment_id: str, name: str) -> HttpResponseBase:
        path = jobs.source_model_file(self.assignment(assignment_id), name)
        return ranged_download(request, default_storage.open(path, "rb"), name, default_storage.size(path))


class AssignmentStartView(WorkerAPIView):
    """The node has begun: offered → running (harmless if repeated)."""

    @extend_schema(request=None, responses={200: dict})
    def post(self, request: Request, assignment_id: str) -> Response:
        refuse_body(request.data)
        assignment = jobs.start(self.worker, self.assignment(assignment_id).pk)
        return Response({"state": assignment.state})


class ArtifactUploadView(WorkerAPIView):
    """One artifact of the kind's list, raw bytes, size-limited: whole, or in ordered parts
    with ``Content-Range: bytes START-END/TOTAL`` (202 until the last part, then 201)."""

    parser_classes = [parsers.FileUploadParser]

    @extend_schema(
        request={"application/octet-stream": bytes},
        parameters=[
            OpenApiParameter(
                "Content-Range",
                str,
                OpenApiParameter.HEADER,
                description="For an artifact sent in parts: 'bytes START-END/TOTAL'. Parts go in order; "
                "START 0 begins again.",
            ),
            OpenApiParameter(
                "Content-Disposition",
                str,
                OpenApiParameter.HEADER,
                required=True,
                description='attachment; filename="<the artifact\'s name>"',
            ),
        ],
        responses={
            201: dict,
            202: OpenApiResponse(dict, description="A part was kept; more are expected (received, size_bytes)."),
            409: OpenApiResponse(dict, description="The part does not follow: continue from 'received'."),
        },
    )
    def put(self, request: Request, assignment_id: str, filename: str) -> Response:
        upload = request.data.get("file") if isinstance(request.data, dict) else None
        try:
            info = jobs.store_artifact(
                self.worker, self.assignment(assignment_id).pk, filename, upload, request.headers.get("Content-Range")
            )
        except OutOfOrder as exc:
            return Response(exc.body(), status=status.HTTP_409_CONFLICT)
        return Response(info, status=status.HTTP_201_CREATED if info["complete"] else status.HTTP_202_ACCEPTED)


class ResultView(WorkerAPIView):
    """The signed ComputeResult (and the worker's signed SUBMIT_RESULT transaction). For a
    trained kind the answer carries ``challenge``: the checkpoints to upload next."""

    @extend_schema(request=dict, responses={202: dict})
    def post(self, request: Request, assignment_id: str) -> Response:
        assignment = jobs.submit(self.worker, self.assignment(assignment_id).pk, request.data)
        return Response(jobs.submission_answer(assignment), status=status.HTTP_202_ACCEPTED)


class AssignmentFailView(WorkerAPIView):
    """The node cannot finish the job: it is expired with the reason and reassigned."""

    @extend_schema(request=dict, responses={200: dict})
    def post(self, request: Request, assignment_id: str) -> Response:
        reason = request.data.get("reason") if isinstance(request.data, dict) else None
        assignment = jobs.fail(self.worker, self.assignment(assignment_id).pk, reason)
        return Response({"state": assignment.state, "reason": assignment.reason})
