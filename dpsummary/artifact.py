"""Signed release artifacts: one JSON file holding a DSSE v1 envelope around an in-toto Statement.

File layout (exactly ``canonical_json(envelope) + b"\\n"``; any other byte sequence is refused)::

    {"payload": <base64 of canonical_json(statement)>,
     "payloadType": "application/vnd.in-toto+json",
     "signatures": [{"keyid": <hex key id>, "sig": <base64 Ed25519 signature over PAE>}]}

    PAE = b"DSSEv1" SP len(payloadType) SP payloadType SP len(payload) SP payload
          (lengths as ASCII decimal byte counts, payload = the decoded bytes)

    statement = {"_type": "https://in-toto.io/Statement/v1",
                 "subject": [{"name": "dpsummary-release-body",
                              "digest": {"sha256": sha256(canonical_json(body))}}],
                 "predicateType": "https://dpsummary.dev/privacy-claim/v1",
                 "predicate": {"claim": <privacy claim>, "body": <release body>}}

Canonical JSON (RFC 8785 *style*, not byte-identical to JCS): object keys sorted by code point,
no insignificant whitespace, UTF-8 without ASCII escaping, ``NaN``/``Infinity`` refused, floats
written with Python's ``repr`` (shortest round-trip form, e.g. ``1.0``, ``1e-06``, ``1e+22``);
JCS would write ``1`` and ``0.000001``. The choice is stable, exact for every float64 (reading
a file back and re-serialising reproduces the bytes) and needs no extra dependency.

Two digests exist: the *subject digest* (over the canonical body, inside the signed statement)
and the *artifact digest* (``sha256:`` over the whole file's bytes, :func:`artifact_digest`),
which is what :func:`write_artifact` returns and what the ledger's commit entry records.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from . import keys as _keys
from .errors import FixedError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://dpsummary.dev/privacy-claim/v1"
SUBJECT_NAME = "dpsummary-release-body"

__all__ = [
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "ArtifactError",
    "artifact_digest",
    "canonical_json",
    "pae",
    "read_artifact",
    "sha256_hex",
    "write_artifact",
]


#: The fix of an artifact path that cannot be read.
ARTIFACT_PATH_FIX = "pass the path of a release artifact (the .dpsummary.json file `dpsummary release` wrote)"


def _looks_like(path: Path, data: bytes) -> str:
    """What a file that is not an artifact looks like, by its kind only (its name's suffix and
    leading bytes; none of its content is repeated: it may be the private data itself)."""
    if data[:4] == b"PAR1":
        return "it is a Parquet file"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "it is not UTF-8 text (a binary file?)"
    if not text.strip():
        return "it is empty"
    first = text.lstrip().splitlines()[0]
    if path.suffix.lower() in (".csv", ".tsv", ".txt") or ("," in first and not first.startswith(("{", "["))):
        return "it looks like a CSV table (comma-separated text)"
    return "it is UTF-8 text but not JSON"


class ArtifactError(FixedError, ValueError):
    """An artifact that is unsigned, malformed, tampered with, or signed by another key (its
    ``fix``, when set, is the advice the CLI prints after it)."""


# --------------------------------------------------------------------------- canonical JSON


def _prepare(obj: Any, depth: int = 0) -> Any:
    if depth > 200:
        raise ValueError("object nested too deeply for canonical JSON")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError("canonical JSON refuses NaN and infinities")
        return float(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise ValueError(f"canonical JSON needs string keys, got {type(k).__name__}")
            out[k] = _prepare(v, depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        return [_prepare(v, depth + 1) for v in obj]
    # numpy scalars and arrays (duck-typed, numpy is not imported here)
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return _prepare(obj.tolist(), depth + 1)
    raise ValueError(f"cannot serialise {type(obj).__name__} as canonical JSON")


def canonical_json(obj: Any) -> bytes:
    """Canonical UTF-8 JSON bytes of ``obj`` (see module docstring for the exact rules)."""
    return json.dumps(
        _prepare(obj),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


# --------------------------------------------------------------------------- writing


def published_timestamp(iso_time: Any) -> float | None:
    """POSIX seconds of a published ISO-8601 time (the release's recorded start, whole seconds),
    or ``None`` when ``iso_time`` is not one. Files a release writes carry this time as their
    access and modification times (issue 35): the file system's own times would mark the end of
    the run at nanosecond precision, i.e. publish the run time, a function of the data."""
    import datetime as _dt

    if not isinstance(iso_time, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(iso_time)
    except ValueError:
        return None
    if t.tzinfo is None:
        return None
    return float(int(t.timestamp()))


def stamp_published_time(paths: Any, iso_time: Any) -> None:
    """Set the access and modification times of ``paths`` (those that exist) to the published
    time ``iso_time`` (see :func:`published_timestamp`; nothing happens when it is not one).

    Call it AFTER the last read of the files: reading a file moves its access time to the
    moment of the read (Linux ``relatime`` does so whenever atime <= mtime, as here), which would
    time the run (issue 47). What it cannot set: a file's ctime (the kernel's) and the times of
    the directories holding it (SECURITY.md: publish a copy)."""
    stamp = published_timestamp(iso_time)
    if stamp is None:
        return
    for path in paths:
        if path is None:
            continue
        with contextlib.suppress(OSError):
            os.utime(path, (stamp, stamp))


def _atomic_write(path: Path, data: bytes, *, file_time: float | None = None) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename); ``file_time``: the
    access and modification times the file gets before it appears (see :func:`published_timestamp`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if file_time is not None:
            os.utime(tmp, (file_time, file_time))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def build_envelope(
    body: dict[str, Any],
    claim: dict[str, Any],
    private_key: _keys.Ed25519PrivateKey | None,
    keyid: str | None = None,
) -> dict[str, Any]:
    """The DSSE envelope (as a dict) for ``body`` and ``claim``; unsigned when no key is given."""
    if not isinstance(body, dict) or not isinstance(claim, dict):
        raise ValueError("body and claim must be dicts")
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": SUBJECT_NAME, "digest": {"sha256": sha256_hex(canonical_json(body))}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"claim": claim, "body": body},
    }
    payload = canonical_json(statement)
    signatures = []
    if private_key is not None:
        kid = keyid if keyid is not None else _keys.key_id(private_key)
        if kid != _keys.key_id(private_key):
            raise ValueError("keyid does not belong to the private key")
        sig = _keys.sign(private_key, pae(PAYLOAD_TYPE, payload))
        signatures.append({"keyid": kid, "sig": base64.b64encode(sig).decode("ascii")})
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": PAYLOAD_TYPE,
        "signatures": signatures,
    }


def write_artifact(
    path: str | Path,
    body: dict[str, Any],
    claim: dict[str, Any],
    private_key: _keys.Ed25519PrivateKey | None,
    keyid: str | None = None,
) -> str:
    """Write the signed artifact atomically (temp file in the same directory, fsync, replace).

    Returns the artifact digest ``"sha256:<hex>"`` of the written bytes. ``private_key=None``
    writes an unsigned artifact, which readers refuse unless ``allow_unsigned=True``.
    """
    data = canonical_json(build_envelope(body, claim, private_key, keyid)) + b"\n"
    # The file's times are the body's published start (``created``), never the end of the run.
    _atomic_write(Path(path), data, file_time=published_timestamp(body.get("created")))
    return "sha256:" + sha256_hex(data)


def artifact_digest(path: str | Path) -> str:
    """``"sha256:<hex>"`` of the artifact file's bytes."""
    try:
        return "sha256:" + sha256_hex(Path(path).read_bytes())
    except OSError as exc:
        raise ArtifactError(f"cannot read artifact {path}: {exc.strerror}", fix=ARTIFACT_PATH_FIX) from None


# --------------------------------------------------------------------------- reading


def _b64decode_canonical(s: Any, what: str) -> bytes:
    if not isinstance(s, str):
        raise ArtifactError(f"malformed artifact: {what} is not a string")
    try:
        raw = base64.b64decode(s.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ArtifactError(f"malformed artifact: {what} is not valid base64") from None
    if base64.b64encode(raw).decode("ascii") != s:
        raise ArtifactError(f"malformed artifact: {what} is not canonical base64")
    return raw


def _default_public_key() -> _keys.Ed25519PublicKey | None:
    path = _keys.default_key_dir() / f"{_keys.DEFAULT_KEY_NAME}.pub"
    if not path.exists():
        return None
    return _keys.load_public_key(path)


def read_artifact(
    path: str | Path,
    public_key: _keys.Ed25519PublicKey | None = None,
    *,
    allow_unsigned: bool = False,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Read and verify an artifact; returns ``(body, claim, envelope_info)``.

    Verification: the file is exactly the canonical serialisation of a well-formed envelope;
    the payload is canonical base64 of the canonical statement; the statement has our types; the
    subject digest equals the digest of the canonical body; and (unless ``allow_unsigned``) one
    signature carries the key id of ``public_key`` and verifies over the PAE. When
    ``public_key`` is None the curator's default public key (``keys.default_key_dir()``) is
    used if it exists. Any failure raises :class:`ArtifactError` with a one-line message.

    ``envelope_info``: ``{"verified": bool, "keyid": str | None, "subject_digest": str,
    "artifact_digest": str, "payload_type": str}``.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read artifact {p}: {exc.strerror}", fix=ARTIFACT_PATH_FIX) from None
    try:
        env = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ArtifactError(f"{p.name} is not a release artifact: {_looks_like(p, data)}, not the signed JSON "
                            "envelope `dpsummary release` writes", fix=ARTIFACT_PATH_FIX) from None
    if not isinstance(env, dict) or set(env) != {"payload", "payloadType", "signatures"}:
        raise ArtifactError(f"malformed artifact {p.name}: not a DSSE envelope")
    try:
        canonical_file = canonical_json(env) + b"\n"
    except ValueError:
        raise ArtifactError(f"malformed artifact {p.name}: not canonical JSON") from None
    if canonical_file != data:
        raise ArtifactError(f"malformed artifact {p.name}: not in canonical form (modified?)")
    if env["payloadType"] != PAYLOAD_TYPE:
        raise ArtifactError(f"artifact {p.name}: unexpected payloadType")
    payload = _b64decode_canonical(env["payload"], "payload")
    sigs = env["signatures"]
    if not isinstance(sigs, list) or not all(
        isinstance(s, dict) and set(s) == {"keyid", "sig"} and isinstance(s["keyid"], str)
        for s in sigs
    ):
        raise ArtifactError(f"malformed artifact {p.name}: bad signatures list")
    try:
        statement = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ArtifactError(f"malformed artifact {p.name}: payload is not JSON") from None
    if not isinstance(statement, dict) or canonical_json(statement) != payload:
        raise ArtifactError(f"malformed artifact {p.name}: payload is not canonical JSON")
    if (
        set(statement) != {"_type", "subject", "predicateType", "predicate"}
        or statement["_type"] != STATEMENT_TYPE
        or statement["predicateType"] != PREDICATE_TYPE
    ):
        raise ArtifactError(f"artifact {p.name}: not a dpsummary in-toto statement")
    pred = statement["predicate"]
    if not isinstance(pred, dict) or set(pred) != {"claim", "body"}:
        raise ArtifactError(f"artifact {p.name}: malformed predicate")
    body, claim = pred["body"], pred["claim"]
    if not isinstance(body, dict) or not isinstance(claim, dict):
        raise ArtifactError(f"artifact {p.name}: malformed predicate")
    subject = statement["subject"]
    digest = sha256_hex(canonical_json(body))
    if (
        not isinstance(subject, list)
        or len(subject) != 1
        or subject[0] != {"name": SUBJECT_NAME, "digest": {"sha256": digest}}
    ):
        raise ArtifactError(f"artifact {p.name}: subject digest does not match the body")

    verified_keyid: str | None = None
    if public_key is None and not allow_unsigned:
        public_key = _default_public_key()
        if public_key is None:
            raise ArtifactError(f"artifact {p.name}: no public key given to verify it",
                                fix="pass the curator's public key (.pub) with --key (or --allow-unsigned to read it "
                                "unverified)")
    if public_key is not None:
        kid = _keys.key_id(public_key)
        message = pae(PAYLOAD_TYPE, payload)
        for s in sigs:
            if s["keyid"] != kid:
                continue
            sig = _b64decode_canonical(s["sig"], "signature")
            if _keys.verify(public_key, message, sig):
                verified_keyid = kid
                break
            raise ArtifactError(f"artifact {p.name}: signature does not verify (tampered?)")
        if verified_keyid is None and not allow_unsigned:
            if not sigs:
                raise ArtifactError(f"artifact {p.name} is unsigned")
            raise ArtifactError(f"artifact {p.name}: not signed by key {kid}",
                                fix="pass the public key (.pub) of the curator who signed it with --key")
    info = {
        "verified": verified_keyid is not None,
        "keyid": verified_keyid,
        "subject_digest": "sha256:" + digest,
        "artifact_digest": "sha256:" + sha256_hex(data),
        "payload_type": PAYLOAD_TYPE,
    }
    return body, claim, info
