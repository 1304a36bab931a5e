"""Property test: whatever JSON a client posts to /api/v1/tasks/, the answer is a 201
that wrote one task, or a 4xx JSON naming a field that wrote nothing. Never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from marketplace.kinds import KINDS
from marketplace.models import Task, TaskEvent

pytestmark = pytest.mark.django_db

SPEC_KEYS = sorted({str(key) for kind in KINDS.values() for key in kind.spec_serializer().fields} | {"bogus"})
TOP_KEYS = ["kind", "title", "spec", "dataset", "budget", "min_reputation", "replication", "max_attempts", "draft"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["NaN", "Infinity", "-inf", "1e400", "0.0000000001", "1", "192", "soft", "dialogue"]),
    st.sampled_from([*KINDS, "00000000-0000-0000-0000-000000000000"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
specs = st.one_of(json_values, st.dictionaries(st.sampled_from(SPEC_KEYS), scalars, max_size=6))
bodies = st.fixed_dictionaries(
    {"kind": st.sampled_from([*KINDS, "quantum"]), "budget": st.one_of(scalars, st.just("50"))},
    optional={key: (specs if key == "spec" else scalars) for key in TOP_KEYS if key not in ("kind", "budget")},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(bodies, json_values))
def test_task_create_never_fails_with_a_500(alice_client: APIClient, body: Any) -> None:
    before = (Task.objects.count(), TaskEvent.objects.count())
    response = alice_client.post("/api/v1/tasks/", json.dumps(body), content_type="application/json")
    after = (Task.objects.count(), TaskEvent.objects.count())
    assert response.status_code in (201, 400), (response.status_code, body)
    data = response.json()
    if response.status_code == 201:
        assert after[0] == before[0] + 1
        assert Task.objects.get(pk=data["id"]).budget > 0
    else:
        assert after == before, body
        assert isinstance(data, dict), body
        assert data, body
        assert all(isinstance(key, str) for key in data)
