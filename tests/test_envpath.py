"""Folders named by environment variables (sparserl.envpath.env_dir): the one check behind
SPARSERL_CACHE, SPARSERL_NATIVE_CACHE and SPARSERL_DATA_DIR."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparserl.envpath import EnvPathError, env_dir
from sparserl.errors import SparserlError

VAR = "SPARSERL_TEST_FOLDER"


def test_a_folder_is_made_and_returned(tmp_path, monkeypatch):
    monkeypatch.setenv(VAR, str(tmp_path / "a" / "b"))
    assert env_dir(VAR) == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    assert env_dir(VAR) == tmp_path / "a" / "b"  # already there
    monkeypatch.setenv(VAR, str(tmp_path / "c"))
    assert env_dir(VAR, create=False) == tmp_path / "c" and not (tmp_path / "c").exists()


def test_unset_or_blank_gives_the_default(tmp_path, monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert env_dir(VAR, create=False) is None
    assert env_dir(VAR, tmp_path / "d") == tmp_path / "d" and (tmp_path / "d").is_dir()
    monkeypatch.setenv(VAR, "  ")
    assert env_dir(VAR, tmp_path / "e") == tmp_path / "e"


def test_tilde_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(VAR, "~/cache")
    assert env_dir(VAR) == tmp_path / "cache"


@pytest.mark.parametrize("create", [True, False])
def test_a_file_is_not_a_folder(tmp_path, monkeypatch, create):
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv(VAR, str(tmp_path / "f"))
    with pytest.raises(EnvPathError, match=rf"^{VAR}='{tmp_path}/f': it is a file, not a folder; set {VAR}"):
        env_dir(VAR, create=create)
    monkeypatch.setenv(VAR, str(tmp_path / "f" / "sub"))
    with pytest.raises(EnvPathError, match=rf"{VAR}='{tmp_path}/f/sub': {tmp_path}/f is a file, not a folder"):
        env_dir(VAR, create=create)


def test_a_bad_default_names_the_variable(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    monkeypatch.delenv(VAR, raising=False)
    with pytest.raises(EnvPathError, match=rf"{tmp_path}/f \(the default when {VAR} is unset\): it is a file"):
        env_dir(VAR, tmp_path / "f")


def test_a_folder_that_cannot_be_made(monkeypatch):
    if Path("/proc/sparserl-no").exists() or not Path("/proc").is_dir():
        pytest.skip("needs /proc, where no folder can be made")
    monkeypatch.setenv(VAR, "/proc/sparserl-no/cache")
    with pytest.raises(
        EnvPathError,
        match=rf"{VAR}='/proc/sparserl-no/cache': cannot create the folder "
        r"/proc/sparserl-no/cache \(.+\); set",
    ):
        env_dir(VAR)
    assert issubclass(EnvPathError, SparserlError)


def test_every_folder_variable_goes_through_env_dir(tmp_path, monkeypatch):
    from sparserl.data import resolve_data_dir
    from sparserl.models.loading import cache_dir
    from sparserl.rollout import native

    (tmp_path / "f").write_text("x")
    for var, read in (
        ("SPARSERL_CACHE", cache_dir),
        ("SPARSERL_NATIVE_CACHE", native.cache_dir),
        ("SPARSERL_DATA_DIR", resolve_data_dir),
    ):
        monkeypatch.setenv(var, str(tmp_path / "f"))
        with pytest.raises(EnvPathError, match=f"^{var}="):
            read()
        (tmp_path / var).mkdir()
        monkeypatch.setenv(var, str(tmp_path / var))
        assert read().resolve() == (tmp_path / var).resolve()
