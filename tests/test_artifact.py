"""Tests for dpsummary.artifact: DSSE envelope, canonical JSON, tamper detection."""

from __future__ import annotations

import base64
import json
import random

import pytest

from dpsummary import artifact as art
from dpsummary import keys


@pytest.fixture()
def keypair(tmp_path):
    info = keys.generate_keypair(tmp_path / "keys")
    return keys.load_private_key(info.private_path), keys.load_public_key(info.public_path), info


BODY = {
    "points": [[0.1, -2.5], [1e-300, 3.0]],
    "weights": [10.5, 20.25],
    "model": {"name": "linear", "num_features": 2},
    "transform": {"kind": "identity"},
    "feature_names": ["x1", "é"],
    "software": {"dpsummary": "0.1.0"},
    "created": "2025-01-01T00:00:00Z",
}
CLAIM = {"epsilon": {"rdp": 0.2, "pld": 0.18}, "delta": 1e-6, "adjacency": "add/remove one record"}


def test_canonical_json():
    assert art.canonical_json({"b": 1, "a": [1.0, "x", None, True]}) == b'{"a":[1.0,"x",null,true],"b":1}'
    assert art.canonical_json({"é": 0.1}) == '{"é":0.1}'.encode()
    for bad in [{"x": float("nan")}, {1: 2}, {"x": object()}]:
        with pytest.raises(ValueError):
            art.canonical_json(bad)
    assert art.pae("t", b"ab") == b"DSSEv1 1 t 2 ab"


def test_round_trip(tmp_path, keypair):
    priv, pub, info = keypair
    path = tmp_path / "a.json"
    digest = art.write_artifact(path, BODY, CLAIM, priv, info.keyid)
    assert digest == art.artifact_digest(path)
    body, claim, env = art.read_artifact(path, pub)
    assert body == BODY and claim == CLAIM
    assert env["verified"] and env["keyid"] == info.keyid
    env_json = json.loads(path.read_text())
    assert env_json["payloadType"] == "application/vnd.in-toto+json"
    st = json.loads(base64.b64decode(env_json["payload"]))
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://dpsummary.dev/privacy-claim/v1"
    assert st["subject"][0]["digest"]["sha256"] == art.sha256_hex(art.canonical_json(BODY))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_wrong_key_and_unsigned(tmp_path, keypair):
    priv, pub, info = keypair
    other = keys.load_public_key(keys.generate_keypair(tmp_path / "other").public_path)
    path = tmp_path / "a.json"
    art.write_artifact(path, BODY, CLAIM, priv, info.keyid)
    with pytest.raises(art.ArtifactError, match="not signed by key"):
        art.read_artifact(path, other)
    upath = tmp_path / "u.json"
    art.write_artifact(upath, BODY, CLAIM, None)
    with pytest.raises(art.ArtifactError, match="unsigned"):
        art.read_artifact(upath, pub)
    body, _, env = art.read_artifact(upath, allow_unsigned=True)
    assert body == BODY and not env["verified"]


def test_resigned_payload_with_other_key_detected(tmp_path, keypair):
    priv, pub, info = keypair
    evil = keys.generate_keypair(tmp_path / "evil")
    path = tmp_path / "a.json"
    art.write_artifact(path, BODY, {**CLAIM, "epsilon": {"rdp": 0.01}}, keys.load_private_key(evil.private_path), evil.keyid)
    with pytest.raises(art.ArtifactError):
        art.read_artifact(path, pub)


def test_byte_flips_detected(tmp_path, keypair):
    priv, pub, info = keypair
    path = tmp_path / "a.json"
    art.write_artifact(path, BODY, CLAIM, priv, info.keyid)
    data = path.read_bytes()
    rng = random.Random(1234)
    positions = rng.sample(range(len(data)), min(400, len(data)))
    bad = tmp_path / "bad.json"
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(flipped))
        with pytest.raises(art.ArtifactError) as ei:
            art.read_artifact(bad, pub)
        assert "\n" not in str(ei.value)
    # truncation and appended bytes
    for mutated in (data[:-1], data + b" ", data[:100]):
        bad.write_bytes(mutated)
        with pytest.raises(art.ArtifactError):
            art.read_artifact(bad, pub)


def test_payload_edit_resigned_detected_by_subject(tmp_path, keypair):
    """A statement whose body is edited but subject left alone fails even with a valid signature."""
    priv, pub, info = keypair
    env = art.build_envelope(BODY, CLAIM, None)
    st = json.loads(base64.b64decode(env["payload"]))
    st["predicate"]["body"]["weights"] = [1.0, 2.0]
    payload = art.canonical_json(st)
    sig = keys.sign(priv, art.pae(art.PAYLOAD_TYPE, payload))
    env = {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": art.PAYLOAD_TYPE,
        "signatures": [{"keyid": info.keyid, "sig": base64.b64encode(sig).decode()}],
    }
    path = tmp_path / "x.json"
    path.write_bytes(art.canonical_json(env) + b"\n")
    with pytest.raises(art.ArtifactError, match="subject digest"):
        art.read_artifact(path, pub)
