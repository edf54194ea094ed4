"""Signing keys: the ONE module of dpsummary that creates, reads or uses key material.

* Ed25519 (``cryptography``). Private keys are PEM PKCS#8 (unencrypted; protect them with file
  permissions: they are created with mode 0600 through ``os.open`` and moved into place
  atomically), public keys PEM SubjectPublicKeyInfo.
* Key id: the first 16 bytes (32 hex characters) of SHA-256 over the 32 raw public-key bytes.
* No hash of a data file is computed here or anywhere (issue 24): a hash of a dataset, keyed
  or not, distinguishes neighbouring datasets for whoever can recompute it, and the ledger is
  published to auditors. dpsummary before that change kept a ``curator.secret`` next to the keys
  and wrote an HMAC of each input file under it into the ledger; nothing reads or creates that
  file any more, and a curator who has one should destroy it (SECURITY.md).
* Default directory: ``$DPSUMMARY_HOME/keys`` if set, else ``$XDG_CONFIG_HOME/dpsummary/keys``,
  else ``~/.config/dpsummary/keys``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import FixedError

DEFAULT_KEY_NAME = "dpsummary"
KEYID_BYTES = 16

__all__ = [
    "DEFAULT_KEY_NAME",
    "Ed25519PrivateKey",
    "Ed25519PublicKey",
    "KeyFileError",
    "KeyInfo",
    "default_home",
    "default_key_dir",
    "ensure_default_key",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_key_pem",
    "resolve_signing_key",
    "sign",
    "verify",
]


class KeyFileError(FixedError, ValueError):
    """A key or secret file that is missing, unreadable, malformed or of the wrong type (its
    ``fix``, when set, is the advice the CLI prints after it)."""


@dataclass(frozen=True)
class KeyInfo:
    """Where a key pair lives and its key id."""

    keyid: str
    private_path: Path
    public_path: Path


def default_key_dir() -> Path:
    """``$DPSUMMARY_HOME/keys``, else ``$XDG_CONFIG_HOME/dpsummary/keys``, else ``~/.config/...``."""
    home = os.environ.get("DPSUMMARY_HOME")
    if home:
        return Path(home).expanduser() / "keys"
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "dpsummary" / "keys"


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Hex of the first 16 bytes of SHA-256 over the raw 32-byte public key."""
    if isinstance(public_key, Ed25519PrivateKey):
        public_key = public_key.public_key()
    return hashlib.sha256(_raw_public(public_key)).digest()[:KEYID_BYTES].hex()


def public_key_pem(public_key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    if isinstance(public_key, Ed25519PrivateKey):
        public_key = public_key.public_key()
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _write_atomic(path: Path, data: bytes, mode: int, *, exclusive: bool) -> None:
    """Write ``data`` to a temp file created with ``mode`` (never wider), fsync, then move into
    place. With ``exclusive`` an existing ``path`` is never overwritten (os.link fails)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise KeyFileError(f"{path} already exists; refusing to overwrite it") from None
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def generate_keypair(directory: str | Path, name: str = DEFAULT_KEY_NAME) -> KeyInfo:
    """Create ``<name>.key`` (0600) and ``<name>.pub`` in ``directory``; never overwrites a key."""
    d = Path(directory)
    priv_path, pub_path = d / f"{name}.key", d / f"{name}.pub"
    if priv_path.exists():
        raise KeyFileError(f"{priv_path} already exists; refusing to overwrite it")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_atomic(priv_path, pem, 0o600, exclusive=True)
    _write_atomic(pub_path, public_key_pem(key), 0o644, exclusive=False)
    return KeyInfo(key_id(key), priv_path, pub_path)


#: The fix of a key file that is not there, by what it is.
_KEY_NOT_FOUND_FIXES = {
    "private key": "pass an existing private key with --key (from `dpsummary keygen`), or omit --key to use the "
                   "default key in the dpsummary home's keys/ (created on first use)",
    "public key": "pass the curator's public key file (.pub) with --key",
}


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise KeyFileError(f"{what} file not found: {path}", fix=_KEY_NOT_FOUND_FIXES.get(what)) from None
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} file {path}: {exc.strerror}") from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Load a PEM PKCS#8 Ed25519 private key; :class:`KeyFileError` (one line) otherwise."""
    data = _read(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KeyFileError(f"{path} is not a valid unencrypted PEM private key ({msg})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Load a PEM SubjectPublicKeyInfo Ed25519 public key.

    A private key file is refused (:class:`KeyFileError`, one line that names the file and the
    fix, never its content): where a public key is expected, passing the private key means it
    is being handed to readers (analysts, auditors) who must never hold it."""
    data = _read(path, "public key")
    if b"PRIVATE KEY" in data:
        raise KeyFileError(f"{path} is a PRIVATE key; pass the public key (.pub) instead "
                           "(`dpsummary keygen` writes both; never give the private key to a reader)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KeyFileError(f"{path} is not a valid PEM public key ({msg})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def ensure_default_key(
    directory: str | Path | None = None, name: str = DEFAULT_KEY_NAME
) -> tuple[KeyInfo, bool]:
    """Return the default key pair, creating it if absent.

    Returns ``(info, created)``. Safe against concurrent first use: the private key is linked
    into place exclusively, so two racing processes end up with the same key.
    """
    d = Path(directory) if directory is not None else default_key_dir()
    priv_path, pub_path = d / f"{name}.key", d / f"{name}.pub"
    created = False
    if not priv_path.exists():
        try:
            generate_keypair(d, name)
            created = True
        except KeyFileError:
            if not priv_path.exists():
                raise
    key = load_private_key(priv_path)
    if not pub_path.exists() or load_public_key(pub_path) != key.public_key():
        if pub_path.exists():
            raise KeyFileError(f"{pub_path} does not match {priv_path}")
        _write_atomic(pub_path, public_key_pem(key), 0o644, exclusive=False)
    info = KeyInfo(key_id(key), priv_path, pub_path)
    return info, created


def sign(private_key: Ed25519PrivateKey, data: bytes) -> bytes:
    """Ed25519 signature (64 bytes) over ``data``."""
    return private_key.sign(data)


def verify(public_key: Ed25519PublicKey, data: bytes, sig: bytes) -> bool:
    """True iff ``sig`` is a valid Ed25519 signature of ``data`` under ``public_key``."""
    try:
        public_key.verify(sig, data)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


# ---------------------------------------------------------------- helpers for the release


def default_home() -> Path:
    """The dpsummary home: ``$DPSUMMARY_HOME``, else ``$XDG_CONFIG_HOME/dpsummary``, else
    ``~/.config/dpsummary`` (the key directory is ``<home>/keys``)."""
    return default_key_dir().parent


def resolve_signing_key(path: str | Path | None = None) -> tuple[KeyInfo, bool]:
    """The signing key to use: ``path`` (a ``.key`` file; its ``.pub`` sibling is used or
    created) or the default key, created on first use. Returns ``(info, created)``."""
    if path is None:
        return ensure_default_key()
    p = Path(path)
    key = load_private_key(p)
    pub = p.with_suffix(".pub")
    if pub.exists():
        if load_public_key(pub) != key.public_key():
            raise KeyFileError(f"{pub} does not match {p}")
    else:
        _write_atomic(pub, public_key_pem(key), 0o644, exclusive=False)
    return KeyInfo(key_id(key), p, pub), False
