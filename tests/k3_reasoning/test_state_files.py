"""k3's state stays private: a state directory others can write, a signing key or ledger others
can read, and a symlinked key are refused with a message that says how to fix it."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from k3.cli import main
from k3.reasoning import Ledger, ReasoningMemory, load_or_create_secret
from k3.reasoning.private import UnsafeStateError
from k3.reasoning.secret import SECRET_NAME

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_state_dir_others_can_write_is_refused(tmp_path, mode):
    state = tmp_path / "state"
    state.mkdir()
    load_or_create_secret(str(state))
    state.chmod(mode)
    with pytest.raises(UnsafeStateError, match="writable by other users.*chmod 700"):
        load_or_create_secret(str(state))


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_signing_key_others_can_read_is_refused(tmp_path, mode):
    load_or_create_secret(str(tmp_path))
    (tmp_path / SECRET_NAME).chmod(mode)
    with pytest.raises(UnsafeStateError, match="open to other users.*delete it"):
        load_or_create_secret(str(tmp_path))


def test_a_symlinked_signing_key_is_never_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    target = elsewhere / "key"
    target.write_bytes(b"k" * 32)
    target.chmod(0o600)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / SECRET_NAME).symlink_to(target)
    with pytest.raises(UnsafeStateError, match="symlink"):
        load_or_create_secret(str(state))
    (state / SECRET_NAME).unlink()
    (state / SECRET_NAME).symlink_to(tmp_path / "missing")  # dangling: not created through the link
    with pytest.raises(UnsafeStateError, match="symlink"):
        load_or_create_secret(str(state))
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_ledger_others_can_read_is_refused(tmp_path, mode):
    path = tmp_path / "ledger.sqlite"
    Ledger(str(path)).close()
    path.chmod(mode)
    with pytest.raises(UnsafeStateError, match="open to other users.*chmod 600"):
        Ledger(str(path))


def test_private_state_opens_and_serve_refuses_loose_state_before_binding(tmp_path):
    state = tmp_path / "state"
    memory = ReasoningMemory.open(str(state / "ledger.sqlite"), secret_dir=str(state))
    memory.close()
    assert ReasoningMemory.open(str(state / "ledger.sqlite"), secret_dir=str(state)) is not None
    state.chmod(0o777)
    refused = CliRunner().invoke(main, ["serve", "--port", "0", "--state-dir", str(state)])
    assert refused.exit_code == 2 and "writable by other users" in refused.output, refused.output
    state.chmod(0o700)
    (state / "ledger.sqlite").chmod(0o644)
    refused = CliRunner().invoke(
        main, ["serve", "--port", "0", "--state-dir", str(state), "--ledger", str(state / "ledger.sqlite")]
    )
    assert refused.exit_code == 2 and "chmod 600" in refused.output, refused.output
