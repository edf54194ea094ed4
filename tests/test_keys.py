"""Tests for dpsummary.keys."""

from __future__ import annotations

import stat

import pytest

from dpsummary import keys


def test_generate_and_load(tmp_path):
    info = keys.generate_keypair(tmp_path / "k")
    assert stat.S_IMODE(info.private_path.stat().st_mode) == 0o600
    assert info.private_path.name == "dpsummary.key" and info.public_path.name == "dpsummary.pub"
    priv = keys.load_private_key(info.private_path)
    pub = keys.load_public_key(info.public_path)
    assert keys.key_id(pub) == keys.key_id(priv) == info.keyid and len(info.keyid) == 32
    sig = keys.sign(priv, b"hello")
    assert keys.verify(pub, b"hello", sig)
    assert not keys.verify(pub, b"hellO", sig)
    assert not keys.verify(pub, b"hello", sig[:-1] + bytes([sig[-1] ^ 1]))
    with pytest.raises(keys.KeyFileError, match="already exists"):
        keys.generate_keypair(tmp_path / "k")
    assert not [p for p in (tmp_path / "k").iterdir() if p.name.endswith(".tmp")]


def test_load_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.key"
    bad.write_text("not a key")
    for fn, path in [
        (keys.load_private_key, bad),
        (keys.load_public_key, bad),
        (keys.load_private_key, tmp_path / "missing.key"),
    ]:
        with pytest.raises(keys.KeyFileError) as ei:
            fn(path)
        assert "\n" not in str(ei.value)
    info = keys.generate_keypair(tmp_path)
    with pytest.raises(keys.KeyFileError):
        keys.load_private_key(info.public_path)


def test_default_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "h"))
    assert keys.default_key_dir() == tmp_path / "h" / "keys"
    monkeypatch.delenv("DPSUMMARY_HOME")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "x"))
    assert keys.default_key_dir() == tmp_path / "x" / "dpsummary" / "keys"


def test_ensure_default_key_creates_no_curator_secret(monkeypatch, tmp_path):
    """Issue 24: no secret keys a hash of the data any more, so none is created."""
    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path))
    info, created = keys.ensure_default_key()
    assert created
    info2, created2 = keys.ensure_default_key()
    assert not created2 and info2 == info
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["dpsummary.key", "dpsummary.pub"]
    assert stat.S_IMODE(info.private_path.stat().st_mode) == 0o600
