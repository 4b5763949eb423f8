"""The installer: idempotent by stamp, reinstalls a group whose pins changed, says why it failed."""

import sys
from dataclasses import replace

import pytest

from runners.conformance import install


@pytest.fixture
def fake_installers(monkeypatch):
    calls = []

    def fake(directory, pins):
        calls.append((directory.name, dict(pins)))
        directory.mkdir(parents=True, exist_ok=True)
        for name, pin in install.PINS.items():
            if pin.group == directory.name:
                program = install.Installed(directory.parent).program(name) if pin.program else None
                for path in filter(None, [program, directory / "bin" / "python"]):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text("")

    monkeypatch.setattr(install, "INSTALLERS", {"npm": fake, "aider": fake, "sdk": fake})
    monkeypatch.setattr(install, "_verify", lambda installed, group: None)
    return calls


def test_second_run_is_a_no_op_and_a_changed_pin_reinstalls_only_its_group(
    tmp_path, fake_installers, monkeypatch
):
    installed = install.ensure(cache=tmp_path, log=lambda m: None)
    assert sorted(group for group, _ in fake_installers) == ["aider", "npm", "sdk"]
    assert installed.program("codex") == tmp_path / "npm" / "node_modules" / ".bin" / "codex"
    assert installed.python("sdk") == tmp_path / "sdk" / "bin" / "python"
    install.ensure(cache=tmp_path, log=lambda m: None)
    assert len(fake_installers) == 3
    bumped = dict(install.PINS, aider=replace(install.PINS["aider"], version="0.0.1"))
    monkeypatch.setattr(install, "PINS", bumped)
    install.ensure(cache=tmp_path, log=lambda m: None)
    assert fake_installers[-1] == ("aider", {"aider-chat": "0.0.1"}) and len(fake_installers) == 4


def test_a_missing_program_reinstalls_even_with_a_stamp(tmp_path, fake_installers):
    installed = install.ensure(["claude-code"], cache=tmp_path, log=lambda m: None)
    installed.program("opencode").unlink()
    install.ensure(["claude-code"], cache=tmp_path, log=lambda m: None)
    assert [group for group, _ in fake_installers] == ["npm", "npm"]


def test_no_npm_is_its_own_error(tmp_path, monkeypatch):
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    with pytest.raises(install.NoNpm, match="npm is not installed"):
        install.ensure(["codex"], cache=tmp_path, log=lambda m: None)


def test_a_failed_install_says_what_and_shows_the_tail(tmp_path):
    failing = [sys.executable, "-c", "import sys; print('npm error code ENOTFOUND registry'); sys.exit(3)"]
    with pytest.raises(install.InstallError, match=r"(?s)npm install x failed \(exit 3\).*ENOTFOUND"):
        install._run(failing, tmp_path, "npm install x")


def test_an_install_that_does_not_run_its_pinned_version_is_an_error(tmp_path):
    installed = install.Installed(tmp_path)
    for name in ("claude-code", "codex", "opencode"):
        program = installed.program(name)
        program.parent.mkdir(parents=True, exist_ok=True)
        version = install.PINS[name].version if name != "opencode" else "0.0.0"
        program.write_text(f"#!/bin/sh\necho {version}\n")
        program.chmod(0o755)
    with pytest.raises(install.InstallError, match=r"opencode-ai@.* does not run as expected: 0\.0\.0"):
        install._verify(installed, "npm")
