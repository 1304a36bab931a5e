"""REST endpoints of dataset uploads in parts (``marketplace/dataset_uploads.py``).

``POST /api/v1/dataset-uploads/`` declares the file (size checked at once), each
``PUT /api/v1/dataset-uploads/<id>/`` carries one part with ``Content-Range``: 202 while
more are expected, 201 with the Dataset after the last, 409 with ``received`` for a part
that does not follow. Whose uploads a request sees is decided by ``OwnedViewSet``.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from config.api.uploads import OutOfOrder
from config.api.viewsets import OwnedViewSet
from marketplace import dataset_uploads
from marketplace.api import serializers as s
from marketplace.models import DatasetUpload, DatasetUploadQuerySet

_ERRORS = inline_serializer(
    "DatasetUploadPartError",
    fields={"Content-Range": serializers.ListField(child=serializers.CharField())},
)
_CONFLICT = inline_serializer(
    "DatasetUploadPartConflict",
    fields={
        "Content-Range": serializers.ListField(child=serializers.CharField()),
        "received": serializers.IntegerField(),
    },
)


class DatasetUploadViewSet(OwnedViewSet, mixins.RetrieveModelMixin):
    """Your dataset uploads in parts, for files larger than one request should carry."""

    serializer_class = s.DatasetUploadSessionSerializer
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"
    pagination_class = None

    def base_queryset(self) -> DatasetUploadQuerySet:
        # An expired upload is gone for its owner too, before the periodic task deletes it.
        return DatasetUpload.objects.filter(expires_at__gt=timezone.now())

    @extend_schema(
        request=s.DatasetUploadSessionCreateSerializer,
        responses={201: s.DatasetUploadSessionSerializer},
        description="Declare a dataset file to send in parts. A size over the dataset limit is refused "
        "here (400 naming size_bytes). The answer's part_bytes is the largest part a PUT may carry.",
    )
    def create(self, request: Request) -> Response:
        form = s.DatasetUploadSessionCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        upload = dataset_uploads.begin_dataset_upload(request.user, **form.validated_data)  # type: ignore[arg-type]
        return Response(s.DatasetUploadSessionSerializer(upload).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request={"application/octet-stream": bytes},
        parameters=[
            OpenApiParameter(
                "Content-Range",
                str,
                OpenApiParameter.HEADER,
                required=True,
                description="'bytes START-END/TOTAL' (END inclusive, TOTAL the declared size_bytes). Parts go "
                "in order, each at most part_bytes; START 0 begins again.",
            ),
        ],
        responses={
            201: OpenApiResponse(
                s.DatasetSerializer,
                description="The last part: the file passed the dataset checks and is now this Dataset. "
                "Sending the last part again is answered the same.",
            ),
            202: OpenApiResponse(s.DatasetUploadProgressSerializer, description="A part was kept; send the next."),
            400: OpenApiResponse(
                _ERRORS,
                description="A malformed or mismatched Content-Range, or the file is refused (naming file, "
                "as a single upload is; the upload is then deleted).",
            ),
            409: OpenApiResponse(_CONFLICT, description="The part does not follow: continue from 'received'."),
            411: OpenApiResponse(description="No Content-Length."),
            413: OpenApiResponse(_ERRORS, description="The part is larger than part_bytes."),
        },
        description="One part of the file, raw bytes.",
    )
    def update(self, request: Request, pk: str | None = None) -> Response:
        upload = self.get_object()
        try:
            got = dataset_uploads.receive_part(
                request.user,  # type: ignore[arg-type]
                upload.pk,
                request.stream,
                request.headers.get("Content-Range"),
                request.headers.get("Content-Length"),
            )
        except OutOfOrder as exc:
            return Response(exc.body(), status=status.HTTP_409_CONFLICT)
        if got.dataset is not None:
            return Response(s.DatasetSerializer(got.dataset).data, status=status.HTTP_201_CREATED)
        progress = {"received": got.received, "size_bytes": got.size_bytes, "complete": False}
        return Response(progress, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={204: None}, description="Abandon an upload: its bytes are deleted.")
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        dataset_uploads.abort_dataset_upload(request.user, self.get_object().pk)  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)
