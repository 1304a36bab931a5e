"""A virtual zip: an archive of another zip's members, assembled on the fly from the
upload's own bytes. Any zip reader reads it as the members it names, the same bytes every
time and at any offset, and it never reads a byte of the upload outside those members."""

from __future__ import annotations

import io
import os
import random
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from training.virtualzip import Member, Recipe, VirtualZip, VirtualZipError, digest, locate

NAMES = ["a/one.parquet", "a/two.parquet", "b/three.parquet", "ünïcode/four.parquet"]


def contents(name: str) -> bytes:
    rng = random.Random(name)
    # Half noise, half repetition: deflate shrinks it, but not to nothing.
    return bytes(rng.randrange(256) for _ in range(3000)) + name.encode() * 200


def upload(tmp_path: Path, method: int) -> Path:
    """An upload with a member that is left out, written by a stream (sizes after the data)."""

    class Stream(io.RawIOBase):
        def __init__(self, out: io.BufferedWriter) -> None:
            self.out = out

        def writable(self) -> bool:
            return True

        def write(self, data: object) -> int:
            return self.out.write(data)  # type: ignore[arg-type]

    path = tmp_path / f"upload-{method}.zip"
    with path.open("wb") as out, zipfile.ZipFile(Stream(out), "w", method) as archive:
        for name in [*NAMES[:2], "secret/left-out.parquet", *NAMES[2:]]:
            archive.writestr(name, contents(name))
    return path


def recipe_of(path: Path, names: list[str]) -> Recipe:
    size = path.stat().st_size
    with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
        members = tuple(locate(raw, archive.getinfo(name), size) for name in names)
    return digest(Recipe(members, size), path)


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_virtual_zip_reads_as_the_members_it_names(tmp_path: Path, method: int) -> None:
    path = upload(tmp_path, method)
    recipe = recipe_of(path, NAMES)
    with VirtualZip(recipe, path.open("rb")) as raw, zipfile.ZipFile(raw) as served:
        assert served.namelist() == NAMES
        assert served.testzip() is None
        for info in served.infolist():
            assert info.compress_type == method  # a deflated member is served deflated
            assert served.read(info) == contents(info.filename)
    with VirtualZip(recipe, path.open("rb")) as served:
        body = served.read()
    assert b"left-out" not in body
    # The size and sha256 digested are those of the bytes served, every time.
    assert len(body) == recipe.size
    assert digest(recipe, path).sha256 == recipe.sha256
    assert recipe_of(path, NAMES) == recipe
    assert Recipe.from_json(recipe.to_json()) == recipe


def test_a_virtual_zip_reads_the_same_at_any_offset(tmp_path: Path) -> None:
    path = upload(tmp_path, zipfile.ZIP_DEFLATED)
    recipe = recipe_of(path, NAMES)
    with VirtualZip(recipe, path.open("rb")) as served:
        body = served.read()
        rng = random.Random(1)
        for _ in range(200):
            start, length = rng.randrange(len(body) + 10), rng.randrange(1, 5000)
            served.seek(start)
            assert served.read(length) == body[start : start + length]
        assert served.seek(-10, os.SEEK_END) == len(body) - 10
        assert served.read() == body[-10:]
        assert served.read(5) == b""


def test_a_recipe_reaching_outside_the_upload_is_refused(tmp_path: Path) -> None:
    path = upload(tmp_path, zipfile.ZIP_STORED)
    recipe = recipe_of(path, NAMES)
    size = path.stat().st_size
    (first, *rest) = recipe.members
    for reach, why in [
        (replace(first, offset=size - 10), "lies outside the upload's"),
        (replace(first, compress_size=size), "lies outside the upload's"),
    ]:
        with pytest.raises(VirtualZipError, match=why):
            VirtualZip(replace(recipe, members=(reach, *rest)), path.open("rb"))
    # An upload of another size than the recipe's is not read at all.
    with pytest.raises(VirtualZipError, match="the recipe was written for"):
        VirtualZip(replace(recipe, upload_size=size + 1), path.open("rb"))
    # Bytes of another size than those digested are not served.
    with pytest.raises(VirtualZipError, match=r"not the .* digested"):
        VirtualZip(replace(recipe, size=recipe.size + 1), path.open("rb"))
    for forged in (
        b"{}",
        b'{"format": "proofwork-virtual-zip/1", "members": [["x", -1, 1, 1, 0, 0]], '
        b'"upload_size": 5, "size": 0, "sha256": ""}',
    ):
        with pytest.raises(VirtualZipError, match="not a virtual zip recipe"):
            Recipe.from_json(forged)


def test_an_encrypted_or_oddly_compressed_member_is_not_served_raw(tmp_path: Path) -> None:
    path = upload(tmp_path, zipfile.ZIP_STORED)
    with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
        info = archive.getinfo(NAMES[0])
        info.flag_bits |= 0x1
        with pytest.raises(VirtualZipError, match="is encrypted"):
            locate(raw, info, path.stat().st_size)
        info = archive.getinfo(NAMES[1])
        info.compress_type = 99
        with pytest.raises(VirtualZipError, match="compression method 99"):
            locate(raw, info, path.stat().st_size)
        info = archive.getinfo(NAMES[2])
        info.header_offset += 1
        with pytest.raises(VirtualZipError, match="no local header"):
            locate(raw, info, path.stat().st_size)


def test_member_fields_round_trip(tmp_path: Path) -> None:
    member = Member("x.parquet", 30, 5, 5, 123, zipfile.ZIP_STORED)
    assert Recipe.from_json(Recipe((member,), 100).to_json()).members == (member,)
