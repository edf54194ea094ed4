"""Audits of what every release does to records before its mechanism: the total per-record
rules and the noisy data-quality counts (``quality``), and the record count under the CSV
line neighbours of issue 24 (``csv-lines``). Registered by the self-test's driver (they belong
to the pipeline, not to one mechanism)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..accounting import calibrate_gaussian, epsilon, gaussian_event
from .audits import gaussian_audit
from .config import AuditResult, Progress, SelfTestConfig
from .randomness import Injection

#: The "quality" scenario's public schema and canary (one record every data-quality rule touches).
QUALITY_SCHEMA: dict[str, Any] = {
    "target": "y",
    "columns": [
        {"name": "x1", "kind": "numeric", "lower": 0, "upper": 10},
        {"name": "x2", "kind": "categorical", "categories": ["a", "b", "c"]},
        {"name": "y", "kind": "categorical", "categories": ["no", "yes"]},
    ],
}
QUALITY_CANARY = b"\xff\xfe,zzz,"


def quality_design(background: int) -> tuple[bytes, bytes]:
    """The "quality" canary design: D = ``background`` clean records (CSV bytes); D' = D plus
    :data:`QUALITY_CANARY`: undecodable bytes in the numeric column (so also an imputed numeric),
    an unseen category and a missing target (so also dropped). It adds exactly 1 to each of the
    four released quality counts, the worst case of add/remove for that mechanism."""
    rows = [b"x1,x2,y"] + [f"{(3 * i) % 10}.5,{'abc'[i % 3]},{('no', 'yes')[i % 2]}".encode() for i in range(background)]
    clean = b"\n".join(rows) + b"\n"
    return clean, clean + QUALITY_CANARY + b"\n"


def quality_outcome(path: Any, *, inject: Injection = "none") -> Any:
    """The release's record handling on one file: the encoded source, or None when the release
    would refuse. ``inject="refuse-invalid"`` restores the removed behaviour (strict parsing:
    one invalid value refuses the release)."""
    from ..data import DataError, Schema, Transform
    from ..policy import DataQuality
    from ..private.source import PrivateSource

    schema = Schema.model_validate(QUALITY_SCHEMA)
    rules = DataQuality()
    source = PrivateSource.open(path)
    if inject == "refuse-invalid":
        try:
            from ..data import read_csv

            Transform.from_schema(schema).apply(read_csv(path, private=True))
        except DataError:
            return None
    return source.encode(Transform.from_schema(schema), missing_numeric=rules.missing_numeric,
                         unseen_category=rules.unseen_category)


def quality_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of the invalid-record handling (see the module docstring),
    calibrated on its own: the quality counts are one Gaussian mechanism whose accountant reports
    ``cfg.epsilon`` at ``cfg.delta``. The reading and encoding are deterministic, so each side is
    read once and the mechanism is drawn per run; a refusal scores +inf. The score, the sum of the
    four noisy counts (D's counts are all zero), is Neyman-Pearson optimal for the mean shift."""
    import tempfile

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    clean, poisoned = quality_design(cfg.design.background)
    with tempfile.TemporaryDirectory(prefix="dpsummary-selftest-") as tmp:
        outcomes = []
        for name, content in (("d.csv", clean), ("d1.csv", poisoned)):
            p = Path(tmp) / name
            p.write_bytes(content)
            outcomes.append(quality_outcome(p, inject=cfg.inject))

        return gaussian_audit(cfg, alpha, _quality_score(outcomes, sigma), scenario="quality",
                              mechanism="noisy_quality_counts", sigma=sigma, claimed=claimed, progress=progress)


def _quality_score(outcomes: list[Any], sigma: float) -> Any:
    """One run's score of a quality audit: the sum of the four noisy quality counts of the side's
    encoded source (D's counts are all zero; Neyman-Pearson optimal for the mean shift), +inf
    where the side's release would refuse (``None``)."""

    def draw(canary: bool) -> float:
        encoded = outcomes[int(canary)]
        if encoded is None:
            return math.inf
        return float(np.sum(list(encoded.noisy_quality_counts(noise_multiplier=sigma).noisy.values())))

    return draw


#: The Parquet quality canary (issue 35): one record whose string values hold bytes that are not
#: UTF-8, in a schema column (the numeric x1: undecodable, so also imputed) and in a column outside
#: the schema (``note``), with an unseen category and a missing target. Parquet writers do not
#: validate UTF-8, so such a record reaches the reader as a typed string column.
PARQUET_CANARY: dict[str, bytes] = {"x1": b"\xff\xfe", "x2": b"zzz", "y": b"", "note": b"caf\xe9"}


def quality_parquet_design(background: int, directory: Path) -> tuple[Path, Path]:
    """The "quality" design as Parquet files with string-typed columns (as a Spark job or a
    pyarrow writer from buffers leaves them): D = the clean records of :func:`quality_design`
    plus a ``note`` column outside the schema; D' = D plus :data:`PARQUET_CANARY`, which adds
    exactly 1 to each of the four released quality counts. Returns (path of D, path of D')."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    clean, _ = quality_design(background)
    rows = [line.split(b",") + [b"note"] for line in clean.split(b"\n")[1:] if line]
    names = ["x1", "x2", "y", "note"]

    def write(name: str, records: list[list[bytes]]) -> Path:
        cols = {}
        for j, col in enumerate(names):
            values = [r[j] for r in records]
            offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
            # From buffers: Arrow does not validate UTF-8 here, exactly as a Parquet writer does not.
            cols[col] = pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets.tobytes()),
                                                    pa.py_buffer(b"".join(values)))
        path = directory / name
        pq.write_table(pa.table(cols), path)
        return path

    return write("d.parquet", rows), write("d1.parquet", [*rows, [PARQUET_CANARY[c] for c in names]])


@contextmanager
def _utf8_decoding(inject: Injection) -> Iterator[None]:
    """The product's UTF-8 decoding (undecodable bytes replaced and flagged), or with
    ``inject="strict-utf8"`` a strict decoder in its place (the behaviour issue 35 removed for
    Parquet string columns: one record's invalid bytes raise and stop the release)."""
    from ..data import stream

    if inject != "strict-utf8":
        yield
        return

    def strict(col: Any) -> tuple[Any, np.ndarray]:
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.cast(col, pa.string()), np.zeros(len(col), dtype=bool)

    original = stream._decode_utf8
    stream._decode_utf8 = strict
    try:
        yield
    finally:
        stream._decode_utf8 = original


def quality_parquet_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """:func:`quality_audit` on Parquet (issue 35): the same mechanism, calibration and score on
    :func:`quality_parquet_design`. The product reads the canary's invalid bytes as U+FFFD and
    flags its record; ``inject="strict-utf8"`` restores the crash (a refusal, score +inf),
    which the audit separates from D with certainty."""
    import tempfile

    import pyarrow as pa

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    with tempfile.TemporaryDirectory(prefix="dpsummary-selftest-") as tmp, _utf8_decoding(cfg.inject):
        outcomes = []
        for path in quality_parquet_design(cfg.design.background, Path(tmp)):
            try:
                outcomes.append(quality_outcome(path, inject=cfg.inject))
            except (pa.ArrowInvalid, UnicodeDecodeError):  # only the injected strict decoder raises
                outcomes.append(None)

    return gaussian_audit(cfg, alpha, _quality_score(outcomes, sigma), scenario="quality-parquet",
                          mechanism="noisy_quality_counts", sigma=sigma, claimed=claimed, progress=progress)


#: The "csv-lines" scenario (issue 24): one line inserted into a clean CSV, each a line that a
#: reader letting a quoted field run across lines, or ending a record at a bare CR, reads as
#: many records. ``where``: right after the header, before the middle line, or as the last line
#: (no final newline). The quoted newline is two physical lines.
CSV_LINE_NEIGHBOURS: dict[str, tuple[bytes, str]] = {
    "unclosed-quote-after-header": (b'3.5,"a,yes', "header"),
    "unclosed-quote-middle": (b'3.5,"a,yes', "middle"),
    "unclosed-quote-last": (b'3.5,a,"yes', "last"),
    "lone-quote": (b'"', "middle"),
    "quoted-newline": (b'3.5,"a\nb",yes', "middle"),
    "bare-cr": (b"3.5,a,yes\r4.5,b,no", "middle"),
    "bare-cr-in-field": (b"3.5,a\r,yes", "middle"),  # one record (the count's real sensitivity)
}


def csv_line_design(background: int) -> tuple[bytes, dict[str, bytes]]:
    """D (the "quality" scenario's clean CSV of ``background`` records) and each neighbour of
    :data:`CSV_LINE_NEIGHBOURS` as CSV bytes."""
    clean, _ = quality_design(background)
    lines = clean.split(b"\n")[:-1]
    out = {}
    for name, (line, where) in CSV_LINE_NEIGHBOURS.items():
        if where == "last":
            out[name] = clean + line
        else:
            at = 1 if where == "header" else len(lines) // 2
            out[name] = b"\n".join(lines[:at] + [line] + lines[at:]) + b"\n"
    return clean, out


def _multiline_csv(self: Any) -> Iterator[Any]:
    """INJECTED BUG ``multiline-csv``: the CSV reading issue 24 removed (the old stdlib fallback):
    ``csv.reader`` over the whole file, so a quoted field runs across lines and a bare CR ends a
    record; ragged rows dropped and counted as before."""
    import csv
    import sys

    import pyarrow as pa

    width = len(self.header)
    old_limit = csv.field_size_limit()
    csv.field_size_limit(sys.maxsize)
    try:
        with open(self.path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
            fh.readline()
            cols: list[list[bytes]] = [[] for _ in range(width)]
            for row in csv.reader(fh, strict=False):
                if not row:
                    continue
                if len(row) != width:
                    self.ragged_rows += 1
                    continue
                for j, v in enumerate(row):
                    cols[j].append(v.encode("utf-8", errors="surrogateescape"))
            if cols[0]:
                yield pa.RecordBatch.from_arrays([pa.array(c, pa.binary()) for c in cols], names=self.header)
    finally:
        csv.field_size_limit(old_limit)


@contextmanager
def _csv_reading(inject: Injection) -> Iterator[None]:
    """The product's CSV reading, or with ``inject="multiline-csv"`` :func:`_multiline_csv` in
    its place (class attribute swapped for the duration, then restored)."""
    from ..data import BatchStream

    if inject != "multiline-csv":
        yield
        return
    original = BatchStream._csv
    BatchStream._csv = _multiline_csv  # type: ignore[method-assign]
    try:
        yield
    finally:
        BatchStream._csv = original  # type: ignore[method-assign]


def csv_lines_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box audit of the record count's sensitivity under the CSV line neighbours (issue 24).

    The product's reader (:func:`dpsummary.data.stream_pass`) reads D and every neighbour of
    :func:`csv_line_design` once (deterministic): the exact record counts must differ by at most
    one (the count's sensitivity, reported as ``sensitivity``; more is a violation on its own).
    Then the Clopper-Pearson audit of ``PrivateSource.noisy_record_count`` (one Gaussian
    mechanism, calibrated so that the accountant reports ``cfg.epsilon`` at ``cfg.delta``) on D
    against the neighbour whose count moved most, score ``|noisy count - count(D)|``.
    ``inject="multiline-csv"`` restores the old multi-line reading (:func:`_multiline_csv`): an
    unclosed quote after the header then swallows every record."""
    import dataclasses
    import tempfile

    from ..data import stream_pass
    from ..private.source import PrivateSource

    class _Count:
        def __init__(self) -> None:
            self.rows = 0

        def add(self, batch: Any) -> None:
            self.rows += batch.num_rows

        def discard(self) -> None:
            self.rows = 0

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    clean, neighbours = csv_line_design(cfg.design.background)
    with tempfile.TemporaryDirectory(prefix="dpsummary-selftest-") as tmp, _csv_reading(cfg.inject):
        paths = {}
        for name, content in (("base", clean), *neighbours.items()):
            paths[name] = Path(tmp) / f"{name}.csv"
            paths[name].write_bytes(content)
        counts = {name: stream_pass(p, _Count)[0].rows for name, p in paths.items()}
        moved = {name: abs(counts[name] - counts["base"]) for name in neighbours}
        worst = max(moved, key=lambda name: moved[name])
        sources = [PrivateSource.open(paths["base"]), PrivateSource.open(paths[worst])]

        def draw(canary: bool) -> float:
            return float(abs(sources[int(canary)].noisy_record_count(noise_multiplier=sigma) - counts["base"]))

        result = gaussian_audit(cfg, alpha, draw, scenario="csv-lines", mechanism="noisy_record_count",
                                 sigma=sigma, claimed=claimed, progress=progress)
    return dataclasses.replace(result, sensitivity=float(moved[worst]),
                               violation=result.violation or moved[worst] > 1)
