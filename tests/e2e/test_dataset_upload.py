"""The /datasets page uploads a file in parts, in a real headless Chromium against daphne.

The server here takes parts of 64 KiB (PROOFWORK_DATASET_UPLOAD_PART_BYTES, set before
this module's daphne starts), so a 200 KiB file goes up in four parts.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from marketplace.models import Dataset, DatasetUpload
from tests.e2e import browsing
from tests.e2e.browsing import expect
from tests.factories import PASSWORD, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PART = 64 * 1024


@pytest.fixture(scope="module", autouse=True)
def _small_parts() -> Iterator[None]:
    """Module-scoped and autouse, so it runs before ``live_url`` starts daphne."""
    previous = os.environ.get("PROOFWORK_DATASET_UPLOAD_PART_BYTES")
    os.environ["PROOFWORK_DATASET_UPLOAD_PART_BYTES"] = str(PART)
    yield
    if previous is None:
        os.environ.pop("PROOFWORK_DATASET_UPLOAD_PART_BYTES", None)
    else:
        os.environ["PROOFWORK_DATASET_UPLOAD_PART_BYTES"] = previous


def log_in(page: Any, username: str) -> None:
    """A new user, signed in."""
    UserFactory(username=username)
    browsing.log_in(page, username)


def embeddings_file(tmp_path: Any) -> tuple[Any, bytes]:
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng(7).standard_normal((400, 128)).astype(np.float32))
    path = tmp_path / "embeddings.npy"
    path.write_bytes(buf.getvalue())
    return path, buf.getvalue()


def test_a_file_larger_than_a_part_goes_up_in_parts(page: Any, tmp_path: Any) -> None:
    path, content = embeddings_file(tmp_path)
    assert len(content) > 3 * PART
    log_in(page, "ines")
    ranges: list[str] = []
    held: list[Any] = []
    failed_once: list[str] = []

    def on_part(route: Any) -> None:
        request = route.request
        if request.method != "PUT":
            route.continue_()
            return
        header = request.headers["content-range"]
        ranges.append(header)
        if header.startswith(f"bytes {PART}-") and not failed_once:
            failed_once.append(header)
            route.abort("connectionreset")  # the network drops the second part once: retried
        elif header.endswith(f"-{len(content) - 1}/{len(content)}"):
            held.append(route)  # the last part waits, so the page can be looked at mid-upload
        else:
            route.continue_()

    page.route(re.compile(r"/api/v1/dataset-uploads/[0-9a-f-]+/$"), on_part)
    page.get_by_role("link", name="Datasets").click()
    page.get_by_label("File").set_input_files(str(path))
    page.get_by_label("Name").fill("teacher rows")
    page.get_by_role("button", name="Upload").click()

    progress = page.locator("#upload-progress-bar")
    expect()(progress).to_be_visible()
    expect()(progress).to_have_attribute("value", str(3 * PART))
    expect()(page.locator("#upload-progress-text")).to_have_text(f"0.2 MB of {len(content) / 2**20:.1f} MB")
    expect()(page.get_by_role("button", name="Upload")).to_be_disabled()
    assert not Dataset.objects.exists()  # nothing is a dataset before the last part
    upload = DatasetUpload.objects.get()
    assert (upload.name, upload.size_bytes) == ("teacher rows", len(content))
    held[0].continue_()

    expect()(page).to_have_url(re.compile(r"/datasets/$"))
    expect()(page.locator("#messages")).to_contain_text("Uploaded “teacher rows” (NumPy array (.npy))")
    row = page.get_by_role("row").filter(has_text="teacher rows")
    expect()(row).to_contain_text("npy")
    dataset = Dataset.objects.get(owner__username="ines")
    assert dataset.sha256 == hashlib.sha256(content).hexdigest()
    assert dataset.size_bytes == len(content)
    expect()(row.locator("code.hash")).to_have_attribute("title", dataset.sha256)
    # In order, one range each, the dropped one sent again.
    starts = [int(r.split()[1].split("-")[0]) for r in ranges]
    assert starts == [0, PART, PART, 2 * PART, 3 * PART]
    assert failed_once == [f"bytes {PART}-{2 * PART - 1}/{len(content)}"]


def test_a_refused_file_shows_the_error_by_the_input(page: Any, tmp_path: Any) -> None:
    garbage = tmp_path / "weights.bin"
    garbage.write_bytes(bytes(range(256)) * 1024)  # 256 KiB of binary: no supported format
    log_in(page, "jon")
    page.goto("/datasets/")
    page.get_by_label("File").set_input_files(str(garbage))
    page.get_by_role("button", name="Upload").click()
    error = page.locator("#id_file_error")
    expect()(error).to_contain_text("Unsupported file type")
    expect()(page.get_by_label("File")).to_have_attribute("aria-invalid", "true")
    expect()(page.locator("#upload-progress")).to_be_hidden()
    expect()(page.get_by_role("button", name="Upload")).to_be_enabled()
    expect()(page.get_by_text("No datasets yet.")).to_be_visible()
    assert not Dataset.objects.exists()
    assert not DatasetUpload.objects.exists()


def test_without_javascript_the_form_posts_the_whole_file(browser: Any, live_url: str, tmp_path: Any) -> None:
    path, content = embeddings_file(tmp_path)
    context = browser.new_context(base_url=live_url, java_script_enabled=False)
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        UserFactory(username="kai")
        page.goto("/accounts/login/")
        page.get_by_label("Username").fill("kai")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.goto("/datasets/")
        page.get_by_label("File").set_input_files(str(path))
        page.get_by_role("button", name="Upload").click()
        expect()(page.locator("#messages")).to_contain_text("Uploaded “embeddings.npy”")
        assert Dataset.objects.get(owner__username="kai").sha256 == hashlib.sha256(content).hexdigest()
        assert not DatasetUpload.objects.exists()
    finally:
        context.close()
