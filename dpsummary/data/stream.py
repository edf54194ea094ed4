"""The streaming reader: one pass over a CSV or Parquet file as Arrow record batches (the
release path, every engine; see :mod:`dpsummary.data` for the record rule). pyarrow is imported
inside the functions that use it."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..header import DataError, _is_parquet, normalise_text, read_header
from .parsing import parse_floats

#: Bytes per block of the streaming CSV reader (a public constant; bounds the reader's memory).
STREAM_BLOCK_BYTES = 4 << 20
#: Bytes per pyarrow parse task within a block (pyarrow parses a block's tasks in parallel).
_ARROW_PARSE_BYTES = 1 << 20
#: Rows per batch of the stdlib fallback reader and of Parquet batches.
STREAM_BATCH_ROWS = 1 << 16


def arrow_empty_string() -> Any:
    """``""`` as an Arrow string scalar, built from its buffers.

    Why not ``pa.scalar("")`` (or a Python ``""`` argument to a compute function): converting any
    Python or numpy value to Arrow makes pyarrow import pandas to check the value's type, 0.2 s
    of a release plus 0.06 s at exit (issue 29), for nothing the reader needs. The release path
    builds its Arrow constants and masks from buffers (this and :func:`arrow_bool_mask`)."""
    import pyarrow as pa

    return pa.StringArray.from_buffers(1, pa.py_buffer(bytes(8)), pa.py_buffer(b""))[0]


def arrow_bool_mask(mask: np.ndarray) -> Any:
    """A numpy bool vector as an Arrow boolean array, built from its bit-packed buffer (no
    Python-to-Arrow conversion, see :func:`arrow_empty_string`)."""
    import pyarrow as pa

    flags = np.ascontiguousarray(mask, dtype=bool)
    bits = np.packbits(flags, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), int(flags.shape[0]), [None, pa.py_buffer(bits)])


#: numpy dtypes of the fixed-width Arrow types :func:`arrow_to_numpy` reads from their buffers.
_NUMPY_OF_ARROW = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
                   "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "float": np.float32,
                   "double": np.float64}


def _bits(buffer: Any, offset: int, length: int) -> np.ndarray:
    """Bits ``offset .. offset+length`` of an Arrow bitmap (least significant bit first)."""
    packed = np.frombuffer(buffer, dtype=np.uint8)
    return np.unpackbits(packed, count=offset + length, bitorder="little")[offset:].astype(bool)


def arrow_to_numpy(arr: Any, *, null: Any = None) -> np.ndarray:
    """A new numpy array of the values of a boolean, integer or floating-point Arrow array (one
    chunk), read from its buffers; nulls become ``null`` (which must then be given).

    Why not ``Array.to_numpy``: pyarrow converts through its pandas converter, which imports
    pandas (see :func:`arrow_empty_string`). The result equals ``to_numpy(zero_copy_only=False)``
    with the nulls filled (tests/test_data.py compares them, slices and nulls included)."""
    import pyarrow as pa

    n, offset = len(arr), arr.offset
    validity, data = arr.buffers()[:2]
    if pa.types.is_boolean(arr.type):
        values = _bits(data, offset, n) if n else np.zeros(0, dtype=bool)
    elif str(arr.type) in _NUMPY_OF_ARROW:
        dtype = np.dtype(_NUMPY_OF_ARROW[str(arr.type)])
        values = np.frombuffer(data, dtype=dtype, count=offset + n)[offset:].copy() if n else np.zeros(0, dtype)
    else:
        raise TypeError(f"arrow_to_numpy reads boolean and numeric arrays, not {arr.type}")
    if arr.null_count:
        if null is None:
            raise ValueError("the array holds nulls: pass null=<fill value>")
        values[~_bits(validity, offset, n)] = null
    return values


def text_column(col: Any) -> tuple[Any, np.ndarray]:
    """One Arrow column of a batch as normalised text, and which rows held undecodable bytes.

    The reader's public rules, vectorised, decided by the column's Arrow TYPE alone (the file's
    schema, public; :func:`text_kind`), never by its values (issue 47):

    * byte-like types (``string``, ``large_string``, ``string_view``, ``binary``,
      ``large_binary``, ``binary_view``, ``fixed_size_binary``; dictionaries and extension types
      stored as any of them) are decoded as UTF-8 value by value: undecodable bytes become
      U+FFFD and flag their row, every other row is untouched;
    * types with a text form (integers, floats, decimals, dates, times, timestamps, durations,
      booleans, null) are cast to Arrow's text form; that cast is total on these types (an
      out-of-range date or timestamp reads as Arrow's ``<value out of range: N>`` text, tested
      in tests/data/test_text_types.py), and should a value ever fail it, only that value
      reads as missing (:func:`_cast_per_value`);
    * every other type (lists, structs, maps, unions) has no text form: every value of the
      column reads as missing, a rule on the schema decided before any value is looked at.

    Then nulls are missing (""), Unicode NFKC (skipped for all-ASCII batches, where it is the
    identity) and leading/trailing Unicode whitespace removed. Returns ``(pa.StringArray or
    pa.LargeStringArray, bool ndarray)``; PRIVATE (the flags go only into the quality-count
    mechanism)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], type=col.type)
    n = len(col)
    bad = np.zeros(n, dtype=bool)
    kind = text_kind(col.type)
    while isinstance(col.type, pa.BaseExtensionType):
        col = col.storage
    if pa.types.is_dictionary(col.type):
        # Each distinct value read once by the same rules, then looked up per row (a row's text
        # and flag depend only on its own value; a null index is missing).
        words, flags = text_column(col.dictionary)
        indices = col.indices
        valid = arrow_to_numpy(pc.is_valid(indices))
        codes = arrow_to_numpy(indices.cast(pa.int64()), null=0) if n else np.zeros(0, np.int64)
        bad = flags[codes] & valid if len(flags) else bad
        return pc.fill_null(pc.take(words, indices), arrow_empty_string()), bad
    if kind == "bytes":
        text, bad = _decode_utf8(_as_binary(col))
    elif kind == "cast":
        text = _cast_per_value(col)
    else:
        text = pa.nulls(n, pa.string())
    text = pc.fill_null(text, arrow_empty_string())
    if not pc.all(pc.string_is_ascii(text)).as_py() if n else False:
        text = pc.utf8_normalize(text, "NFKC")
    return pc.utf8_trim_whitespace(text), bad


def _value_type(typ: Any) -> Any:
    """The type a column's values have once dictionary encoding and extension wrappers (e.g.
    ``arrow.uuid`` over ``fixed_size_binary(16)``, ``arrow.json`` over ``string``) are removed."""
    import pyarrow as pa

    while True:
        if pa.types.is_dictionary(typ):
            typ = typ.value_type
        elif isinstance(typ, pa.BaseExtensionType):
            typ = typ.storage_type
        else:
            return typ


def text_kind(typ: Any) -> str:
    """How :func:`text_column` reads a column of Arrow type ``typ``: ``"bytes"`` (decoded as
    UTF-8 value by value, undecodable bytes replaced and flagged), ``"cast"`` (Arrow's text form
    of a number, decimal, date, time, timestamp, duration, boolean or null) or ``"none"`` (no
    text form: all missing). A function of the type alone (the file's public schema)."""
    import pyarrow as pa

    t = _value_type(typ)
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)):
        return "bytes"
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_date(t)
            or pa.types.is_time(t) or pa.types.is_timestamp(t) or pa.types.is_duration(t)
            or pa.types.is_boolean(t) or pa.types.is_null(t)):
        return "cast"
    return "none"


def _as_binary(col: Any) -> Any:
    """A byte-like column (see :func:`text_kind`) as ``binary`` or ``large_binary`` holding the
    same bytes per row. String types are VIEWED as bytes, never validated: Arrow does not check
    a string column's UTF-8 when it reads one (Parquet writers such as Spark, or pyarrow from
    buffers, can store invalid bytes under a string type) and every string kernel then raises
    (issue 35). Views and fixed-size binaries go to ``large_binary`` (their total can exceed
    32-bit offsets), a cast that copies bytes and cannot fail."""
    import pyarrow as pa

    t = col.type
    if pa.types.is_string(t):
        return col.view(pa.binary())
    if pa.types.is_large_string(t):
        return col.view(pa.large_binary())
    if pa.types.is_string_view(t):
        col = col.view(pa.binary_view())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return col
    return col.cast(pa.large_binary())


def _cast_per_value(col: Any) -> Any:
    """Arrow's text form of a column of a type with one (:func:`text_kind` ``"cast"``). The
    cast of the whole column is total on every such type pyarrow reads from Parquet (out-of-range
    temporal values print as ``<value out of range: N>``); should it ever raise, each value is
    cast on its own and a value that fails reads as missing: per record, never per column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_timestamp(col.type) and col.type.tz is not None:
        # An instant with a zone prints in UTC ("...Z"), whatever zone the reader attached: a
        # Spark executor attaches its session's zone, so the two engines read the same text.
        col = col.cast(pa.timestamp(col.type.unit, tz="UTC"))
    try:
        return pc.cast(col, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    values: list[str | None] = []
    for i in range(len(col)):
        try:
            values.append(pc.cast(col.slice(i, 1), pa.string())[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            values.append(None)
    return pa.array(values, type=pa.string())  # one batch of short texts: far below 2 GiB


def _decode_utf8(col: Any) -> tuple[Any, np.ndarray]:
    """A binary Arrow array decoded as UTF-8 (``pa.string()``), and which rows held bytes that
    are not UTF-8: those rows' undecodable bytes become U+FFFD (total: any bytes decode). The
    vectorised cast decides every batch that is valid UTF-8; only a batch holding an invalid
    value is decoded value by value. PRIVATE (the flags go only into the quality-count mechanism)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(col)
    bad = np.zeros(n, dtype=bool)
    try:
        return pc.cast(col, pa.string()), bad
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowCapacityError):
        pass  # invalid UTF-8 somewhere, or more than 2 GiB of text: value by value
    values = []
    for i, b in enumerate(col.to_pylist()):
        b = b or b""
        try:
            values.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            bad[i] = True
            values.append(b.decode("utf-8", errors="replace"))
    # A batch's text can exceed 2 GiB only if its bytes do (U+FFFD is 3 bytes for each bad
    # byte, so at most 3x): large_string holds any of it; normalised back to string below
    # only when it fits.
    text = pa.array(values, type=pa.large_string())
    try:
        return text.cast(pa.string()), bad
    except (pa.ArrowInvalid, pa.ArrowCapacityError):
        return text, bad


def text_numbers(text: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, ok, missing)`` of a normalised text column (see :func:`text_column`), the
    rule of :func:`parse_floats` after :func:`normalise_text`: ``ok`` where the value is a
    finite number, ``values`` NaN elsewhere, ``missing`` where the field is empty. Arrow's
    vectorised cast decides a batch whenever it parses every field (on those strings it agrees
    with Python's ``float``); otherwise the batch falls back to the per-distinct-value rule."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = pc.equal(text, arrow_empty_string())
    missing = arrow_to_numpy(empty)
    nullable = pc.if_else(empty, pa.nulls(1, pa.string())[0], text)
    try:
        # A cheap probe first: a text column fails on its first values, without a full cast.
        pc.cast(nullable.slice(0, 64), pa.float64())
        parsed = pc.cast(nullable, pa.float64())
        values = arrow_to_numpy(parsed, null=np.nan).astype(np.float64, copy=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        uniq, codes = dictionary_codes(text)
        arr = np.empty(len(uniq), dtype=object)
        arr[:] = [normalise_text(u) for u in uniq]
        uvals, _ = parse_floats(arr)
        values = uvals[codes] if len(uniq) else np.zeros(len(text))
    ok = np.isfinite(values) & ~missing
    return np.where(ok, values, np.nan), ok, missing


def dictionary_codes(text: Any) -> tuple[list[str], np.ndarray]:
    """Distinct values of a text column and each row's index among them (Arrow's hashing)."""
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(text)
    if hasattr(enc, "combine_chunks"):
        enc = enc.combine_chunks()
    return enc.dictionary.to_pylist(), arrow_to_numpy(enc.indices).astype(np.int64, copy=False)


def batch_columns(batch: Any) -> dict[str, Any]:
    """The columns of an Arrow record batch by normalised name (:func:`normalise_text`)."""
    return {normalise_text(str(name)): batch.column(i) for i, name in enumerate(batch.schema.names)}


class BatchStream:
    """One streaming pass over a private CSV or Parquet file, as Arrow record batches whose
    columns are named by the normalised header (:func:`read_header`).

    CSV, THE record rule (public, per line): **a record is one physical line**. The bytes after
    the header line are split on ``\\n``; one ``\\r`` before it is part of the line end
    (``\\r\\n``); every other ``\\r`` byte reads as a space (a character of its line, so it can
    neither add nor join records); an empty line is skipped. Each line is then parsed on its own
    as CSV (``,`` delimiter, ``"`` quotes, ``""`` an escaped quote, a quote that does not open
    a field is a literal character). A line whose field count differs from the header's, or
    which ends inside a quoted field (an unclosed quote, a lone ``"``, a quoted value holding a
    newline: not supported in CSV, use Parquet), is *ragged*: dropped and counted in
    :attr:`ragged_rows` (PRIVATE: only for the quality-count mechanism). So adding or removing
    one line adds or removes at most one record: whatever a line holds, it affects no other.

    Reading: blocks of about :data:`STREAM_BLOCK_BYTES` cut at line ends (memory O(block +
    longest line), never the table). A block is parsed by pyarrow's CSV reader when that is
    provably the per-line rule: pyarrow parses the block without error (a ragged row raises),
    returns one row per line, and, if the block holds a ``"``, no value holding a newline (a
    quoted field that pyarrow runs across a line end leaves fewer rows than lines, or its
    newline in the last value). Otherwise, and always with
    ``fallback=True``, the block is parsed line by line by the stdlib ``csv`` module
    (:func:`parse_csv_lines`). The two agree on every line (``tests/test_data.py`` runs both on
    the same fixtures). Parquet: ``ParquetFile.iter_batches``: a row is a row."""

    def __init__(self, path: str | Path, *, fallback: bool = False, header: list[str] | None = None) -> None:
        self.path = Path(path)
        self.header = header if header is not None else read_header(self.path)
        self.fallback = fallback
        self.ragged_rows = 0

    def __iter__(self) -> Any:
        if _is_parquet(self.path):
            return self._parquet()
        return self._csv()

    def _parquet(self) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except (OSError, ValueError):
            raise DataError(f"cannot read the Parquet file {self.path}; is it Parquet?") from None
        for batch in pf.iter_batches(batch_size=STREAM_BATCH_ROWS):
            yield pa.RecordBatch.from_arrays(batch.columns, names=self.header)

    def _csv(self) -> Any:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed in the finally below
        except OSError as exc:
            raise DataError(f"cannot read data file {self.path}: {type(exc).__name__}") from None
        try:
            fh.readline()  # the header line, already checked by read_header
            while (block := _line_block(fh)) is not None:
                if self.fallback:
                    batches, ragged = parse_csv_lines(block, self.header)
                else:
                    batches, ragged = _arrow_block(block, self.header)
                self.ragged_rows += ragged
                yield from batches
        except OSError as exc:
            raise DataError(f"cannot read data file {self.path}: {type(exc).__name__}") from None
        finally:
            fh.close()


_BARE_CR = re.compile(rb"\r(?!\n)")
_EMPTY_LINES = re.compile(rb"\n(?:\r?\n)+")


def _line_block(fh: Any) -> bytes | None:
    """The next block of whole lines (about :data:`STREAM_BLOCK_BYTES`, extended to the end of
    its last line; the file's last line gets a ``\\n`` if it has none), with every ``\\r`` that
    does not end a line replaced by a space; ``None`` at the end of the file."""
    block: bytes = fh.read(STREAM_BLOCK_BYTES)
    if not block:
        return None
    if not block.endswith(b"\n"):
        block += fh.readline()
        if not block.endswith(b"\n"):
            block += b"\n"
    if b"\r" in block and block.count(b"\r") != block.count(b"\r\n"):
        block = _BARE_CR.sub(b" ", block)
    return block


def _non_empty_lines(block: bytes) -> int:
    """Lines of a block from :func:`_line_block` that are not empty (both readers skip empty
    ones; every ``\\r`` left in the block ends a line)."""
    return _EMPTY_LINES.sub(b"\n", block.lstrip(b"\r\n")).count(b"\n")


def _arrow_block(block: bytes, header: list[str]) -> tuple[list[Any], int]:
    """Parse one block of whole lines with pyarrow when that provably gives the per-line rule
    of :class:`BatchStream`, else with :func:`parse_csv_lines`. Returns (batches, ragged).

    pyarrow gets no invalid-row handler: a ragged row makes it raise, and the block goes to
    :func:`parse_csv_lines`, which counts ragged lines itself (pyarrow cannot hand a row that is
    not UTF-8 to a Python handler: it would print a warning about the row's bytes instead)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = list(header)
    try:
        table = pcsv.read_csv(
            pa.py_buffer(block),
            read_options=pcsv.ReadOptions(column_names=names, block_size=_ARROW_PARSE_BYTES, use_threads=True),
            parse_options=pcsv.ParseOptions(newlines_in_values=False),
            convert_options=pcsv.ConvertOptions(column_types={c: pa.large_binary() for c in names}, null_values=[],
                                                strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # a ragged row (its message is dropped unread)
        return parse_csv_lines(block, header)
    # pyarrow's rows start at line starts and do not overlap, so one row per (non-empty) line
    # means no row ran across a line end, except perhaps the last one, whose quoted value would
    # then hold the newline. A quoted field run across a line end can also make pyarrow drop
    # rows silently (at the end of one of its parse tasks): the row count catches that too.
    lines = block.count(b"\n")
    if table.num_rows != lines:
        lines = _non_empty_lines(block)  # the slower count, only when the fast one disagrees
    if table.num_rows != lines or (
            b'"' in block and any(_holds_newline(chunk) for col in table.columns for chunk in col.chunks)):
        return parse_csv_lines(block, header)
    return [b for b in table.combine_chunks().to_batches() if b.num_rows], 0


def _holds_newline(chunk: Any) -> bool:
    """Whether the value bytes of a binary Arrow array hold a ``\\n`` (its whole data buffer is
    searched: bytes outside the array's slice can only give a false alarm, a slower block)."""
    data = chunk.buffers()[2]
    return data is not None and b"\n" in data.to_pybytes()


def parse_csv_lines(block: bytes, header: list[str]) -> tuple[list[Any], int]:
    """THE per-line CSV rule of :class:`BatchStream` by the stdlib ``csv`` module: each line of
    ``block`` (whole lines, bare ``\\r`` already replaced, see :func:`_line_block`) parsed on
    its own, fields kept as bytes (undecodable bytes round-trip through ``surrogateescape``).
    Returns ``([one Arrow record batch] or [], ragged)``; ``ragged`` is PRIVATE. A line is
    parsed with a ``\\n`` appended, so a line that ends inside a quoted field is recognised by
    the newline left in its value (a line holds no other newline) and counted as ragged."""
    import sys

    import pyarrow as pa

    width = len(header)
    cols: list[list[bytes]] = [[] for _ in range(width)]
    ragged = 0
    old_limit = csv.field_size_limit()
    csv.field_size_limit(sys.maxsize)  # a field is never refused for its length
    try:
        for raw in block.split(b"\n"):
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                continue  # an empty line, as pyarrow's ignore_empty_lines
            text = line.decode("utf-8", errors="surrogateescape") + "\n"
            fields = next(csv.reader((text,), strict=False), [])
            if len(fields) != width or any("\n" in v for v in fields):
                ragged += 1
                continue
            for j, v in enumerate(fields):
                cols[j].append(v.encode("utf-8", errors="surrogateescape"))
    finally:
        csv.field_size_limit(old_limit)
    if not cols or not cols[0]:
        return [], ragged
    # 64-bit offsets: one line of 2 GiB or more must not overflow a 32-bit binary array (issue 35).
    return [pa.RecordBatch.from_arrays([pa.array(c, pa.large_binary()) for c in cols], names=header)], ragged


def stream_pass(path: str | Path, consumer_factory: Any, *, header: list[str] | None = None) -> tuple[Any, int]:
    """Run one full pass: ``consumer = consumer_factory()``; ``consumer.add(batch)`` for every
    batch of :class:`BatchStream`; on an exception the consumer's ``discard()`` is called and
    the exception propagates. Returns ``(consumer, ragged_rows)`` (``ragged_rows`` PRIVATE)."""
    consumer = consumer_factory()
    stream = BatchStream(path, header=header)
    try:
        for batch in stream:
            consumer.add(batch)
    except BaseException:
        consumer.discard()
        raise
    return consumer, stream.ragged_rows
