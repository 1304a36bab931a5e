"""The node's key file and credentials file (workers/agent/identity.py): a key others can
read is refused as ssh refuses one, and a file that cannot be read (a directory, no
permission) is a clear message from the CLI, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.agent.cli import main
from workers.agent.identity import Credentials, IdentityError, load_key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_key_file_others_can_read_is_refused(mode: int, key_path: Path) -> None:
    key_path.chmod(mode)
    with pytest.raises(IdentityError, match=rf"readable by other users \(mode 0{mode:o}\); .*`chmod 600 {key_path}`"):
        load_key(key_path)
    key_path.chmod(0o600)
    assert load_key(key_path).address.startswith("cpc1")


def test_a_readable_key_gives_the_cli_a_message(key_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key_path.chmod(0o644)
    assert main(["--key", str(key_path), "run", "--broker", "filesystem://"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "chmod 600" in err


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_credentials_file_others_can_read_is_refused(
    mode: int, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """worker.json holds the worker's API token: a copy others can read lets them act as
    the node, so it is refused as the key is, by the loader and with a message by the CLI."""
    creds_path = key_path.with_name("worker.json")
    Credentials(server="http://x", worker_id="w1", address="cpc1x", token="pww_secret").save(creds_path)
    assert Credentials.load(creds_path).token == "pww_secret"  # written private
    creds_path.chmod(mode)
    with pytest.raises(IdentityError, match=rf"readable by other users \(mode 0{mode:o}\); .*API token"):
        Credentials.load(creds_path)
    assert main(["--key", str(key_path), "run", "--broker", "filesystem://"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert f"chmod 600 {creds_path}" in err
    creds_path.chmod(0o600)
    assert Credentials.load(creds_path).token == "pww_secret"


def test_a_directory_or_an_unreadable_file_is_a_message_not_a_traceback(
    tmp_path: Path, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "keys"
    folder.mkdir()
    assert main(["--key", str(folder), "run", "--broker", "filesystem://"]) == 2
    assert "error: Cannot read the key file" in capsys.readouterr().err
    key_path.with_name("worker.json").mkdir()  # the key is fine, its credentials are not a file
    assert main(["--key", str(key_path), "run", "--broker", "filesystem://"]) == 2
    assert "error: Cannot read the credentials file" in capsys.readouterr().err
    if os.geteuid() != 0:  # root reads anything
        key_path.chmod(0o000)
        with pytest.raises(IdentityError, match="Cannot read the key file"):
            load_key(key_path)
