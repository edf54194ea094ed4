"""Tabular data as an explicit, serialisable transform into model space.

Pipeline: :func:`read_csv` gives a :class:`RawTable` of raw strings; a :class:`Schema` says what
each column is (from a policy file, from :func:`infer_schema` for non-private baselines, or from
:func:`dpsummary.private.preprocess.estimate_schema` for a zero-configuration private release);
a :class:`Transform` built from the schema maps raw rows to *model space*: scaled numerics and
one-hot categories, with the encoded target, if any, as the last column.

Documented handling choices
---------------------------
* Reading is total (:func:`read_table`): every field and header name is normalised by one
  public rule (Unicode NFKC, then leading/trailing Unicode whitespace removed, non-breaking
  spaces included); an empty field is *missing*; blank lines are skipped; a UTF-8 byte order
  mark is removed; ragged rows are dropped; undecodable bytes become U+FFFD. Only
  :func:`read_header`'s public checks refuse.
* A CSV record is ONE physical line (:class:`BatchStream`): lines end at ``\n`` or ``\r\n``,
  any other ``\r`` reads as a space, and each line is parsed on its own, so a line that opens a
  quote and never closes it is ragged (dropped, counted) and cannot swallow, split or add other
  records. Quoted newlines inside a value are therefore not supported in CSV (such a record
  becomes ragged lines); use Parquet, where a row is unambiguous.
* Numeric features: public transform (:meth:`Transform.from_schema`) uses centre
  ``(lower+upper)/2`` and scale ``(upper-lower)/2``, and values outside ``[lower, upper]`` are
  **clipped** to the bounds first, so every numeric feature lies in ``[-1, 1]``. Clipping is a
  per-record operation, so it never couples records (unlike data-fitted standardisation).
* :meth:`Transform.fit` (non-private baselines only, ``data_fitted=True``) uses the data mean and
  standard deviation; a constant (or entirely missing) column gets scale 1, so it maps to 0.
  Schema bounds, when present, still clip.
* A missing numeric value is imputed at the centre (0 after scaling).
* Categorical features are one-hot over the schema's categories (all levels, none dropped: the
  model's Gaussian prior keeps the coefficients identifiable). A missing or unseen category is the
  all-zero vector.
* A value that does not parse as a finite number in a numeric column is a :class:`DataError`
  by default (``invalid_numeric="error"``); with ``invalid_numeric="missing"`` it is treated as
  missing. ``nan``/``inf`` strings count as non-numeric.
* Target: a missing, unseen (categorical), non-{0,1} (numeric binary) or negative / non-integer
  (count) target is a :class:`DataError` by default (``invalid_target="error"``); with
  ``invalid_target="drop"`` such rows are removed (a per-record filter, which keeps the
  add/remove-one sensitivity of everything downstream).
* Numeric and count targets are clipped to the schema bounds when bounds are given. Binary targets
  are 0/1 with the *positive class* recorded: ``ColumnSpec.positive`` if given, else the second of
  the two categories in sorted order (for a numeric binary target, 1).
* Columns of the table not named in the schema are ignored.
* The release path uses :meth:`Transform.encode_total`, which never raises on record content:
  a numeric value that is missing, unparsable or not finite (``nan``/``inf``/``infinity`` in any
  case) is missing and is imputed at the centre (default) or drops its record; a missing or
  unseen category is the all-zero "other" vector (default) or drops its record; a missing or
  invalid target drops its record. It returns per-record :class:`QualityIndicators` (PRIVATE:
  only for an accounted noisy-count mechanism, L2 sensitivity ``sqrt(k)`` for ``k`` rules). The
  ``"error"`` options above remain for non-private baselines only.
* A block of lines that pyarrow cannot parse by the per-line rule (a ragged line, a quote that
  pyarrow's parser runs across a line end) is parsed line by line by the stdlib ``csv`` module
  (:func:`parse_csv_lines`); the two agree on every line, so no record can make a release
  refuse or change how another line is read.
* The release streams (:class:`BatchStream`, :func:`stream_pass`): pyarrow's CSV reader /
  ``ParquetFile.iter_batches`` yield Arrow record batches, :func:`encode_batch` applies exactly
  the rules of :meth:`Transform.encode_total` to one batch (a pure function of the batch and the
  public transform, so Spark executors run it too), and nothing holds the raw table as Python
  objects. :func:`read_table` (the whole table as a :class:`RawTable`) remains for non-private
  tools and tests.

Error messages never contain a data value, a row number or a row count when the table was read
with ``private=True``: only the column name and the kind of problem.

Layout (one module per stage; this package re-exports every public name, so
``from dpsummary.data import X`` works for all of them):

* :mod:`dpsummary.header` (outside the package, standard library only): :class:`DataError`,
  :func:`normalise_text`, :func:`read_header`, the one public check before a reservation;
* :mod:`.schema`: :class:`ColumnSpec`, :class:`Schema`, :func:`target_kind`,
  :func:`default_model_name` (pydantic only: validating a policy imports neither numpy nor torch);
* :mod:`.parsing`: :func:`parse_floats`, :func:`factorize` (numpy);
* :mod:`.stream`: :class:`BatchStream`, :func:`stream_pass`, :func:`parse_csv_lines`,
  :func:`text_column` and the Arrow text helpers (the reader of every release pass);
* :mod:`.reading`: :class:`RawTable`, :func:`read_table`, :func:`read_csv` (whole tables, for
  non-private tools and tests);
* :mod:`.inference`: :func:`infer_schema` (non-private);
* :mod:`.transform`: :class:`Transform`, :class:`QualityIndicators` and THE total per-record
  rules (torch);
* :mod:`.encode`: :func:`encode_batch`, one Arrow batch to model space.

Importing this package loads only :mod:`dpsummary.header` and :mod:`.schema`; every other name
is imported from its module on first use (PEP 562 ``__getattr__``). A test that patches a
module constant patches the module that reads it (e.g. ``dpsummary.data.stream.STREAM_BLOCK_BYTES``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..header import MAX_HEADER_BYTES, DataError, normalise_text, read_header
from .schema import (
    NO_TARGET,
    ColumnSpec,
    Schema,
    TargetKind,
    default_model_name,
    target_kind,
)

if TYPE_CHECKING:
    from .encode import EncodedBatch, encode_batch
    from .inference import infer_schema
    from .parsing import factorize, parse_floats
    from .reading import RawTable, ReadReport, read_csv, read_table
    from .stream import (
        STREAM_BATCH_ROWS,
        STREAM_BLOCK_BYTES,
        BatchStream,
        arrow_bool_mask,
        arrow_empty_string,
        batch_columns,
        dictionary_codes,
        parse_csv_lines,
        stream_pass,
        text_column,
        text_numbers,
    )
    from .transform import (
        DTYPE,
        QUALITY_RULES,
        TRANSFORM_FORMAT,
        QualityIndicators,
        Transform,
    )

#: Name -> the submodule that defines it, for the names imported on first use.
_LAZY: dict[str, str] = {
    "EncodedBatch": "encode",
    "encode_batch": "encode",
    "infer_schema": "inference",
    "factorize": "parsing",
    "parse_floats": "parsing",
    "RawTable": "reading",
    "ReadReport": "reading",
    "read_csv": "reading",
    "read_table": "reading",
    "STREAM_BATCH_ROWS": "stream",
    "STREAM_BLOCK_BYTES": "stream",
    "BatchStream": "stream",
    "arrow_bool_mask": "stream",
    "arrow_empty_string": "stream",
    "batch_columns": "stream",
    "dictionary_codes": "stream",
    "parse_csv_lines": "stream",
    "stream_pass": "stream",
    "text_column": "stream",
    "text_numbers": "stream",
    "DTYPE": "transform",
    "QUALITY_RULES": "transform",
    "TRANSFORM_FORMAT": "transform",
    "QualityIndicators": "transform",
    "Transform": "transform",
}


def __getattr__(name: str) -> Any:
    """Import a lazily re-exported name from its module (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DTYPE",
    "MAX_HEADER_BYTES",
    "NO_TARGET",
    "QUALITY_RULES",
    "STREAM_BATCH_ROWS",
    "STREAM_BLOCK_BYTES",
    "TRANSFORM_FORMAT",
    "BatchStream",
    "ColumnSpec",
    "DataError",
    "EncodedBatch",
    "QualityIndicators",
    "RawTable",
    "ReadReport",
    "Schema",
    "TargetKind",
    "Transform",
    "arrow_bool_mask",
    "arrow_empty_string",
    "batch_columns",
    "default_model_name",
    "dictionary_codes",
    "encode_batch",
    "factorize",
    "infer_schema",
    "normalise_text",
    "parse_csv_lines",
    "parse_floats",
    "read_csv",
    "read_header",
    "read_table",
    "stream_pass",
    "target_kind",
    "text_column",
    "text_numbers",
]
