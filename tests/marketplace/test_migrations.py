"""Marketplace data migrations, run for real: migrate back, write rows as the old code
did, migrate forward, and check what the platform then does with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.migrating import migrate, migrated_back
from training import poc

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("marketplace", "0002_datasetupload")]
AFTER = [("marketplace", "0003_synthetic_specs_name_their_generator")]
SEED = {
    "block_hash": "5e" * 32,
    "worker_address": "cpc1qf0ewqq7ut3kq4n6cxw9j0w6d8pd8rz3k2s5jkm",
    "task_id": "3f2b8c1e-6a4d-4e0b-9c57-2d1f0a9b8e71",
}


@pytest.fixture
def old_state() -> Any:
    with migrated_back(BEFORE) as apps:
        yield apps


def test_synthetic_tasks_from_before_the_generator_field_keep_verifying(old_state: Any, tmp_path: Path) -> None:
    user_model = old_state.get_model("marketplace", "User")
    task_model = old_state.get_model("marketplace", "Task")
    owner = user_model.objects.create(username="old-requester")

    def task(kind: str, spec: dict[str, Any]) -> Any:
        return task_model.objects.create(
            owner=owner, title="old", kind=kind, spec=spec, budget=1, price_estimate=1, status="running"
        )

    # As the old code stored them: the validated spec with its defaults, and no generator.
    old = task("synthetic", {"n": 64, "count": 1, "entry_bound": 8})
    named = task("synthetic", {"n": 64, "count": 1, "entry_bound": 8, "generator": "aes256ctr"})
    other = task("cube_training", {"epochs": 1})

    apps = migrate(AFTER)
    specs = {t.pk: t.spec for t in apps.get_model("marketplace", "Task").objects.all()}
    assert specs[old.pk] == {"n": 64, "count": 1, "entry_bound": 8, "generator": "shake128"}
    assert specs[named.pk]["generator"] == "aes256ctr"
    assert specs[other.pk] == {"epochs": 1}

    # A node running the old code computed the old task with SHAKE128 (that generator's
    # bytes are pinned in tests/training/test_poc.py); the migrated spec verifies it.
    out = poc.run({**specs[old.pk], "generator": "shake128"}, SEED, tmp_path, device="cpu")
    assert poc.verify(specs[old.pk], SEED, tmp_path / out["artifact"], out["result_hash"]).ok
    # A spec without the field means the same (a job fetched before the migration ran).
    artifact = tmp_path / out["artifact"]
    assert poc.verify({"n": 64, "count": 1, "entry_bound": 8}, SEED, artifact, out["result_hash"]).ok
    as_new = poc.verify({**specs[old.pk], "generator": "aes256ctr"}, SEED, artifact, out["result_hash"])
    assert as_new.code == "product_mismatch"
