"""Tests for dpsummary.data: reading, schemas, the transform and its documented handling."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pydantic
import pytest
import torch

from dpsummary.data import (
    NO_TARGET,
    ColumnSpec,
    DataError,
    RawTable,
    Schema,
    Transform,
    default_model_name,
    infer_schema,
    read_csv,
    read_header,
    read_table,
    target_kind,
)

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


def write(tmp_path: Path, text: str, name: str = "d.csv", encoding: str = "utf-8") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding=encoding)
    return p


SMALL = "height,colour,weight,label\n1.5,red,10,yes\n2.5,blue,20,no\n,green,30,yes\n3.5,,40,no\n"


def small_table(tmp_path: Path, **kw: bool) -> RawTable:
    return read_csv(write(tmp_path, SMALL), **kw)


def no_digits(msg: str) -> bool:
    return re.search(r"\d", msg) is None


# ---- reading --------------------------------------------------------------------------------
def test_read_basic_and_missing(tmp_path: Path) -> None:
    t = small_table(tmp_path)
    assert t.header == ["height", "colour", "weight", "label"]
    assert t.num_rows == 4
    assert t.columns["height"] == ["1.5", "2.5", "", "3.5"]
    assert t.columns["colour"][3] == ""


def test_read_bom_whitespace_crlf_blank_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "\ufeffa , b\r\n 1 , x \r\n\r\n2,y\r\n", encoding="utf-8")
    t = read_csv(p)
    assert t.header == ["a", "b"]
    assert t.columns == {"a": ["1", "2"], "b": ["x", "y"]}


def test_quoted_path_matches_plain_path(tmp_path: Path) -> None:
    plain = read_csv(write(tmp_path, "a,b\n1,x\n2,y z\n", "p.csv"))
    quoted = read_csv(write(tmp_path, 'a,"b"\n1,"x"\n2,y z\n', "q.csv"))
    assert plain == quoted
    commas = read_csv(write(tmp_path, 'a,b\n1,"x, y"\n', "c.csv"))
    assert commas.columns["b"] == ["x, y"]


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", "empty"),
        ("\n1,2\n", "empty"),
        ("a,a\n1,2\n", "duplicate column name"),
        ("a,,c\n1,2,3\n", "empty column name"),
        ("a\u00a0,a\n1,2\n", "duplicate column name"),  # equal after normalisation
    ],
)
def test_read_errors_are_public_header_facts(tmp_path: Path, text: str, pattern: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(DataError, match=pattern):
        read_header(p)
    with pytest.raises(DataError, match=pattern) as info:
        read_csv(p, private=True)
    assert no_digits(str(info.value).replace(str(p), ""))


def test_record_content_never_refuses(tmp_path: Path) -> None:
    """Ragged rows are dropped and counted, bad bytes replaced and flagged, a header alone reads."""
    p = tmp_path / "d.csv"
    p.write_bytes(b"a,b\n1,2\n3\n4,5,6\n\xff\xfe,x\n7,\"q, r\"\n")
    table, report = read_table(p, private=True)
    assert table.columns["a"] == ["1", "\ufffd\ufffd", "7"]
    assert table.columns["b"] == ["2", "x", "q, r"]
    assert report.ragged_rows == 2
    assert report.undecodable.tolist() == [False, True, False]
    empty, rep = read_table(write(tmp_path, "a,b\n", "h.csv"), private=True)
    assert empty.num_rows == 0 and rep.ragged_rows == 0


def test_normalisation_nbsp_and_nfkc(tmp_path: Path) -> None:
    p = write(tmp_path, "a\u00a0,b\nx\u00a0,\uff11\n", encoding="utf-8")
    t = read_csv(p)
    assert t.header == ["a", "b"]
    assert t.columns == {"a": ["x"], "b": ["1"]}


def test_parquet_round_trip(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1.5, None], "b": ["x ", "y"]}), tmp_path / "d.parquet")
    assert read_header(tmp_path / "d.parquet") == ["a", "b"]
    t = read_csv(tmp_path / "d.parquet")
    assert t.columns == {"a": ["1.5", ""], "b": ["x", "y"]}


def test_encode_total_every_poisoned_record(tmp_path: Path) -> None:
    schema = Schema(columns=[
        ColumnSpec(name="h", kind="numeric", lower=0, upper=10),
        ColumnSpec(name="c", kind="categorical", categories=["red", "blue"]),
        ColumnSpec(name="y", kind="categorical", categories=["no", "yes"]),
    ], target="y")
    tf = Transform.from_schema(schema)
    rows = [
        ("5", "red", "yes"),       # clean
        ("inf", "red", "no"),      # non-finite numeric
        ("Nan", "blue", "no"),     # 'Nan' as a number
        ("abc", "red", "no"),      # non-numeric numeric
        ("1", "green", "no"),      # unseen category
        ("2", "blue\u00a0", "yes"),  # category with a trailing NBSP: matches after normalisation
        ("3", "red", ""),          # missing target
        ("4", "red", "maybe"),     # unseen target
    ]
    text = "h,c,y\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows)
    table = read_csv(write(tmp_path, text, encoding="utf-8"), private=True)
    points, q = tf.encode_total(table, missing_numeric="impute", unseen_category="other")
    ind = dict(zip(q.names, q.indicators.T.tolist(), strict=True))
    assert ind["imputed_numeric"] == [False, True, True, True, False, False, False, False]
    assert ind["other_category"] == [False, False, False, False, True, False, False, False]
    assert ind["dropped_target"] == [False] * 6 + [True, True]
    assert points.shape[0] == 6
    assert points[5, 2].item() == 1.0  # 'blue' one-hot for the NBSP row
    points, q = tf.encode_total(table, missing_numeric="drop", unseen_category="drop")
    assert points.shape[0] == 2


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        read_csv(tmp_path / "nope.csv", private=True)


# ---- schema ---------------------------------------------------------------------------------
def test_infer_schema_small(tmp_path: Path) -> None:
    s = infer_schema(small_table(tmp_path))
    assert s.target == "label"
    h = s.column("height")
    assert (h.kind, h.lower, h.upper, h.integer) == ("numeric", 1.5, 3.5, False)
    assert s.column("weight").integer
    assert s.column("colour").categories == ["blue", "green", "red"]
    assert target_kind(s) == "binary"
    assert infer_schema(small_table(tmp_path), target=NO_TARGET).target is None
    assert infer_schema(small_table(tmp_path), target="weight").target == "weight"
    with pytest.raises(DataError, match="not in the data"):
        infer_schema(small_table(tmp_path), target="nope")


@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity", "NaN"])
def test_infer_schema_rejects_nan_inf(tmp_path: Path, bad: str) -> None:
    t = read_csv(write(tmp_path, f"score,y\n1,0\n{bad},1\n"), private=True)
    with pytest.raises(DataError, match="'score'.*NaN or infinite") as info:
        infer_schema(t)
    assert no_digits(str(info.value).replace("score", ""))


def test_infer_schema_constant_feature_and_target(tmp_path: Path) -> None:
    t = read_csv(write(tmp_path, "c,x,y\n7,1,0\n7,2,1\n7,3,0\n"))
    s = infer_schema(t)
    assert (s.column("c").lower, s.column("c").upper) == (7.0, 8.0)
    with pytest.raises(DataError, match="constant"):
        infer_schema(t, target="c")
    t2 = read_csv(write(tmp_path, "x,y\n1,a\n2,a\n", "one.csv"))
    with pytest.raises(DataError, match="single class"):
        infer_schema(t2)


def test_schema_validation() -> None:
    with pytest.raises(pydantic.ValidationError, match="lower must be below upper"):
        ColumnSpec(name="a", kind="numeric", lower=1, upper=1)
    with pytest.raises(pydantic.ValidationError, match="at least one category"):
        ColumnSpec(name="a", kind="categorical", categories=[])
    with pytest.raises(pydantic.ValidationError, match="twice"):
        ColumnSpec(name="a", kind="categorical", categories=["x", "x"])
    with pytest.raises(pydantic.ValidationError, match="finite"):
        ColumnSpec(name="a", kind="numeric", lower=0, upper=float("inf"))
    a = ColumnSpec(name="a", kind="numeric", lower=0, upper=1)
    with pytest.raises(pydantic.ValidationError, match="duplicate"):
        Schema(columns=[a, a])
    with pytest.raises(pydantic.ValidationError, match="not a column"):
        Schema(columns=[a], target="b")
    with pytest.raises(pydantic.ValidationError):
        Schema.model_validate({"columns": [a.model_dump()], "extra_key": 1})


def num(name: str, lo: float, hi: float, integer: bool = False) -> ColumnSpec:
    return ColumnSpec(name=name, kind="numeric", lower=lo, upper=hi, integer=integer)


def cat(name: str, *cats: str) -> ColumnSpec:
    return ColumnSpec(name=name, kind="categorical", categories=list(cats))


def test_target_kind_and_default_model() -> None:
    x = num("x", 0, 1)
    cases = {
        "binary": Schema(columns=[x, cat("y", "no", "yes")], target="y"),
        "count": Schema(columns=[x, num("y", 0, 50, integer=True)], target="y"),
        "real": Schema(columns=[x, num("y", -3, 3)], target="y"),
        "none": Schema(columns=[x], target=None),
    }
    for kind, schema in cases.items():
        assert target_kind(schema) == kind
    assert target_kind(Schema(columns=[x, num("y", 0, 1, integer=True)], target="y")) == "binary"
    assert [default_model_name(k) for k in ("binary", "count", "real", "none")] == [
        "logistic",
        "poisson",
        "linear",
        "gaussian_mean",
    ]
    with pytest.raises(DataError, match="single class"):
        target_kind(Schema(columns=[x, cat("y", "a")], target="y"))
    with pytest.raises(DataError, match="more than two"):
        target_kind(Schema(columns=[x, cat("y", "a", "b", "c")], target="y"))


# ---- transform ------------------------------------------------------------------------------
PUBLIC = Schema(
    columns=[
        num("height", 0.0, 4.0),
        cat("colour", "red", "green", "blue"),
        num("weight", 0, 20, True),
        cat("label", "no", "yes"),
    ],
    target="label",
)


def test_public_transform_encoding_clipping_and_missing(tmp_path: Path) -> None:
    tr = Transform.from_schema(PUBLIC)
    assert tr.feature_names == ["height", "colour=red", "colour=green", "colour=blue", "weight"]
    assert tr.num_features == 5 and tr.target_kind == "binary" and tr.positive_class == "yes"
    x, y = tr.apply(small_table(tmp_path))
    assert x.dtype == torch.float64 and x.shape == (4, 5)
    assert y is not None
    torch.testing.assert_close(y, torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64))
    # height: centre 2, scale 2; missing -> 0
    torch.testing.assert_close(x[:, 0], torch.tensor([-0.25, 0.25, 0.0, 0.75], dtype=torch.float64))
    # weight clipped to [0, 20]: 10 -> 0, 20 -> 1, 30 -> 1, 40 -> 1
    torch.testing.assert_close(x[:, 4], torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64))
    assert x[:, 1:4].tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0]]  # missing -> zeros
    pts = tr.to_points(small_table(tmp_path))
    assert pts.shape == (4, 6)
    torch.testing.assert_close(pts[:, -1], y)
    assert float(pts[:, :-1].abs().max()) <= 1.0


def test_unseen_category_feature_and_target(tmp_path: Path) -> None:
    tr = Transform.from_schema(PUBLIC)
    t = read_csv(
        write(tmp_path, "height,colour,weight,label\n1,purple,3,yes\n1,red,3,maybe\n"), private=True
    )
    with pytest.raises(DataError, match="'label' has an unseen category") as info:
        tr.apply(t)
    assert no_digits(str(info.value))
    dropping = Transform.from_schema(PUBLIC, invalid_target="drop")
    x, y = dropping.apply(t)
    assert x.shape == (1, 5) and y is not None and y.tolist() == [1.0]
    assert x[0, 1:4].tolist() == [0.0, 0.0, 0.0]  # unseen feature category -> zeros


def test_missing_target_error_or_drop(tmp_path: Path) -> None:
    t = read_csv(
        write(tmp_path, "height,colour,weight,label\n1,red,3,\n2,red,3,no\n"), private=True
    )
    with pytest.raises(DataError, match="missing value") as info:
        Transform.from_schema(PUBLIC).to_points(t)
    assert no_digits(str(info.value))
    pts = Transform.from_schema(PUBLIC, invalid_target="drop").to_points(t)
    assert pts.shape == (1, 6)


def test_non_numeric_in_numeric_column(tmp_path: Path) -> None:
    t = read_csv(write(tmp_path, "height,colour,weight,label\nabc,red,3,no\ninf,red,3,no\n"))
    with pytest.raises(DataError, match="'height'.*not a finite number") as info:
        Transform.from_schema(PUBLIC).apply(t)
    assert "'abc'" in str(info.value)  # non-private: the value and row are shown
    tp = read_csv(
        write(tmp_path, "height,colour,weight,label\nabc,red,3,no\n", "p.csv"), private=True
    )
    with pytest.raises(DataError) as info:
        Transform.from_schema(PUBLIC).apply(tp)
    assert "abc" not in str(info.value) and no_digits(str(info.value))
    x, _ = Transform.from_schema(PUBLIC, invalid_numeric="missing").apply(t)
    assert x[:, 0].tolist() == [0.0, 0.0]  # imputed at the centre


def test_count_and_real_targets(tmp_path: Path) -> None:
    x = num("x", 0, 2)
    count = Transform.from_schema(Schema(columns=[x, num("y", 0, 100, True)], target="y"))
    t = read_csv(write(tmp_path, "x,y\n1,3\n1,250\n"))
    assert count.to_points(t)[:, -1].tolist() == [3.0, 100.0]  # clipped to the public bound
    for bad in ("-1", "2.5", "", "z"):
        tb = read_csv(write(tmp_path, f"x,y\n1,{bad}\n", "b.csv"), private=True)
        with pytest.raises(DataError, match="'y'") as info:
            count.apply(tb)
        assert no_digits(str(info.value))
    real = Transform.from_schema(Schema(columns=[x, num("y", -10, 30)], target="y"))
    y = real.to_points(read_csv(write(tmp_path, "x,y\n1,10\n1,30\n1,50\n", "r.csv")))[:, -1]
    assert y.tolist() == [0.0, 1.0, 1.0]
    torch.testing.assert_close(
        real.inverse_target(y), torch.tensor([10.0, 30.0, 30.0], dtype=torch.float64)
    )


def test_fit_constant_column_and_standardisation(tmp_path: Path) -> None:
    t = read_csv(write(tmp_path, "c,x,y\n7,1,0\n7,2,1\n7,3,0\n7,,1\n"))
    s = infer_schema(t)
    tr = Transform.fit(t, s)
    assert tr.data_fitted and tr.scales["c"] == 1.0 and tr.centres["c"] == 7.0
    x, y = tr.apply(t)
    assert x[:, 0].tolist() == [0.0] * 4
    torch.testing.assert_close(x[:3, 1].mean(), torch.tensor(0.0, dtype=torch.float64))
    assert x[3, 1].item() == 0.0  # missing -> centre
    assert not Transform.from_schema(s).data_fitted


def test_round_trip_json(tmp_path: Path) -> None:
    t = small_table(tmp_path)
    for tr in (
        Transform.from_schema(PUBLIC, invalid_numeric="missing"),
        Transform.fit(t, infer_schema(t)),
        Transform.from_schema(Schema(columns=[num("a", 0, 1)], target=None)),
    ):
        d = json.loads(json.dumps(tr.to_dict()))
        back = Transform.from_dict(d)
        assert back == tr
        if set(tr.schema.names) <= set(t.header):
            assert torch.equal(back.to_points(t), tr.to_points(t))
    with pytest.raises(DataError):
        Transform.from_dict({"format": "something else"})


def test_no_target_points_are_features(tmp_path: Path) -> None:
    t = small_table(tmp_path)
    s = infer_schema(t, target=NO_TARGET)
    tr = Transform.from_schema(s)
    assert tr.target_kind == "none"
    x, y = tr.apply(t)
    assert y is None
    assert torch.equal(tr.to_points(t), x)
    assert x.shape == (4, tr.num_features)


def test_transform_rows(tmp_path: Path) -> None:
    tr = Transform.from_schema(PUBLIC)
    rows = [
        {"height": "1.5", "colour": "red", "weight": "10", "label": "yes"},
        {"height": "2.5", "colour": "blue", "weight": "20", "label": "no"},
    ]
    x, y = tr.transform_rows(rows)
    x2, y2 = tr.apply(small_table(tmp_path))
    assert torch.equal(x, x2[:2]) and y is not None and y2 is not None and torch.equal(y, y2[:2])
    xf, yf = tr.transform_rows([{"height": "1", "colour": "green"}])
    assert yf is None and xf.shape == (1, 5)
    assert xf[0].tolist() == [-0.5, 0.0, 1.0, 0.0, 0.0]  # absent weight: imputed at the centre


def test_sample_public_features_support() -> None:
    tr = Transform.from_schema(PUBLIC)
    g = torch.Generator().manual_seed(0)
    z = tr.sample_public_features(2000, g)
    assert z.shape == (2000, 5) and z.dtype == torch.float64
    assert float(z[:, [0, 4]].min()) >= -1.0 and float(z[:, [0, 4]].max()) <= 1.0
    assert float(z[:, 0].min()) < -0.9 and float(z[:, 0].max()) > 0.9
    onehot = z[:, 1:4]
    assert torch.all(onehot.sum(1) == 1) and set(onehot.unique().tolist()) == {0.0, 1.0}
    assert torch.all(onehot.sum(0) > 500)  # each category drawn


# ---- real data ------------------------------------------------------------------------------
REAL = [
    ("adult.csv", 48842, "binary", ">50K"),
    ("german_credit.csv", 1000, "binary", "good"),
    ("bike_rentals.csv", 17379, "count", None),
]


@pytest.mark.parametrize(("name", "rows", "kind", "positive"), REAL)
def test_real_data(name: str, rows: int, kind: str, positive: str | None) -> None:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    start = time.perf_counter()
    t = read_csv(path, private=True)
    s = infer_schema(t)
    tr = Transform.from_schema(s)
    pts = tr.to_points(t)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0  # well under 1 s on an idle machine; generous for loaded CI
    assert pts.shape == (rows, tr.num_features + 1)
    assert tr.target_kind == kind and tr.positive_class == positive
    assert torch.isfinite(pts).all()
    assert float(pts[:, :-1].abs().max()) <= 1.0
    if kind == "binary":
        assert set(pts[:, -1].unique().tolist()) == {0.0, 1.0}
    else:
        assert float(pts[:, -1].min()) >= 0 and torch.equal(pts[:, -1], pts[:, -1].round())
    fitted = Transform.fit(t, s).to_points(t)
    numeric = [i for i, n in enumerate(tr.feature_names) if "=" not in n]
    assert np.allclose(fitted[:, numeric].mean(0).numpy(), 0.0, atol=1e-9)
    back = Transform.from_dict(json.loads(json.dumps(tr.to_dict())))
    assert back == tr


def test_unclosed_quote_makes_only_its_own_line_ragged(tmp_path: Path) -> None:
    """A quote never closed no longer swallows the lines after it (issue 24): its line alone is
    ragged, and the 200,000 lines after it (several blocks) are read, the last one too."""
    p = tmp_path / "u.csv"
    body = "".join(f"{i},{i}\n" for i in range(200_000))
    p.write_bytes(b'a,b\n1,"2\n' + body.encode() + b"\xff,9")
    table, report = read_table(p, private=True)
    assert table.num_rows == 200_001 and report.ragged_rows == 1
    assert report.undecodable.sum() == 1 and report.undecodable[-1]
    assert table.columns["a"][:2] == ["0", "1"] and table.columns["a"][-1] == "\ufffd"


def test_poisoned_fields_read_without_exception(tmp_path: Path) -> None:
    p = tmp_path / "p.csv"
    p.write_bytes(
        b'name,x,y\nNan,-Infinity,yes\n"a, \nb",nan,no\n\xc3\x28,INF,yes\nshort\nok,1,\n'
    )
    table, report = read_table(p, private=True)
    # A quoted newline is not supported in CSV: '"a, ' is ragged, 'b",nan,no' a record of its own.
    assert table.columns["name"] == ["Nan", 'b"', "\ufffd(", "ok"]
    assert report.ragged_rows == 2
    assert report.undecodable.tolist() == [False, False, True, False]
    schema = Schema(columns=[
        ColumnSpec(name="name", kind="categorical", categories=["ok"]),
        ColumnSpec(name="x", kind="numeric", lower=-1, upper=1),
        ColumnSpec(name="y", kind="categorical", categories=["no", "yes"]),
    ], target="y")
    points, q = Transform.from_schema(schema).encode_total(table)
    ind = dict(zip(q.names, q.indicators.T.tolist(), strict=True))
    assert q.indicators.shape == (4, 5) and q.indicators.dtype == bool
    assert ind["imputed_numeric"] == [True, True, True, False]
    assert ind["other_category"] == [True, True, True, False]
    assert ind["dropped_target"] == [False, False, False, True]
    assert points.shape == (3, 3)


@pytest.mark.parametrize("kind", ["dir", "badparquet", "missing"])
def test_public_header_refusals(tmp_path: Path, kind: str) -> None:
    if kind == "dir":
        p = tmp_path
    elif kind == "badparquet":
        p = tmp_path / "x.parquet"
        p.write_text("a,b\n1,2\n")
    else:
        p = tmp_path / "absent.csv"
    with pytest.raises(DataError):
        read_header(p)


def test_encode_total_normalises_tables_built_in_memory() -> None:
    schema = Schema(columns=[
        ColumnSpec(name="c", kind="categorical", categories=["blue", "red"]),
        ColumnSpec(name="x", kind="numeric", lower=0, upper=2),
    ])
    table = RawTable(header=["c", "x"], columns={"c": ["blue\u00a0", "\uff52ed"], "x": ["1", "NaN"]})
    points, q = Transform.from_schema(schema).encode_total(table, unseen_category="drop")
    assert points.tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    assert q.indicators[:, list(q.names).index("imputed_numeric")].tolist() == [False, True]
    assert not q.indicators[:, list(q.names).index("dropped_category")].any()


# ---- a CSV record is one physical line (issue 24) -------------------------------------------
# (body after the header "a,b,c", expected rows, expected ragged lines): the public per-line rule.
LINE_RULE_FIXTURES = [
    (b"1,2,3\n", [("1", "2", "3")], 0),
    (b'1,"2,3\n4,5,6\n7,8,9\n', [("4", "5", "6"), ("7", "8", "9")], 1),  # unclosed quote
    (b'1,2,"3\n4,5,6\n', [("4", "5", "6")], 1),  # unclosed quote in the last field
    (b'"\n4,5,6\n', [("4", "5", "6")], 1),  # a line of only a quote
    (b'1,"2\n3",4\n5,6,7\n', [("5", "6", "7")], 2),  # a quoted newline: two ragged lines
    (b'"a,b,c\n1,2,3\n', [("1", "2", "3")], 1),
    (b'1,"a"",3\n4,5,6\n', [("4", "5", "6")], 1),  # an escaped quote, then no closing one
    (b'1,2,"\n', [], 1),
    (b'1,2,"3', [], 1),  # unclosed on the last line, no final newline
    (b'""",2,3\n', [], 1),
    (b'1,"ab"c,3\n', [("1", "abc", "3")], 0),  # text after a closing quote
    (b'1,a"b,3\n', [("1", 'a"b', "3")], 0),  # a quote inside an unquoted field is literal
    (b'1,2,3"\n', [("1", "2", '3"')], 0),
    (b'"a"b"c,2,3\n', [('ab"c', "2", "3")], 0),
    (b'1,"a""b",3\n', [("1", 'a"b', "3")], 0),
    (b'1, "a",3\n', [("1", '"a"', "3")], 0),
    (b"1,2,3\r\n4,5,6\r\n", [("1", "2", "3"), ("4", "5", "6")], 0),  # CRLF
    (b"1,2\r3,4\n", [("1", "2 3", "4")], 0),  # a bare CR is a character of its line (a space)
    (b'1,"2\r3",4\n', [("1", "2 3", "4")], 0),
    (b"1,2,3\r\r\n", [("1", "2", "3")], 0),
    (b"\r\n\r\n4,5,6", [("4", "5", "6")], 0),  # blank lines skipped, last line without newline
    (b"   \n1,2\n1,2,3,\n", [], 3),
    (b"1,\xff,3\n1,\x00,3\n", [("1", "\ufffd", "3"), ("1", "\x00", "3")], 0),
]


def _read_both(path: Path) -> list[tuple[list[tuple[str, ...]], int]]:
    """The rows and ragged count of the pyarrow path and of the stdlib per-line path."""
    from dpsummary.data import BatchStream, text_column

    out = []
    for fallback in (False, True):
        stream = BatchStream(path, fallback=fallback)
        rows: list[tuple[str, ...]] = []
        for batch in stream:
            cols = [text_column(batch.column(i))[0].to_pylist() for i in range(batch.num_columns)]
            rows.extend(zip(*cols, strict=True))
        out.append((rows, stream.ragged_rows))
    return out


@pytest.mark.parametrize(("body", "rows", "ragged"), LINE_RULE_FIXTURES)
def test_a_record_is_one_physical_line_in_both_readers(tmp_path: Path, body: bytes,
                                                       rows: list[tuple[str, ...]], ragged: int) -> None:
    p = tmp_path / "f.csv"
    p.write_bytes(b"a,b,c\n" + body)
    arrow, stdlib = _read_both(p)
    assert arrow == stdlib == (rows, ragged)
    table, report = read_table(p, private=True)
    assert table.num_rows == len(rows) and report.ragged_rows == ragged


def test_readers_agree_and_lines_are_independent_on_random_lines(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Random lines over the characters that matter (quotes, CR, LF, commas, bad bytes), widths
    1 to 3, blocks of a few bytes: both readers agree, and reading the file gives exactly what
    reading each line alone gives, concatenated (no line can change how another is read)."""
    import random

    from dpsummary.data import BatchStream
    from dpsummary.data import stream as stream_module

    # The patch reaches the reader: blocks of one byte give one batch per line.
    monkeypatch.setattr(stream_module, "STREAM_BLOCK_BYTES", 1)
    three = tmp_path / "three.csv"
    three.write_bytes(b"c\n1\n2\n3\n")
    assert len(list(BatchStream(three))) == 3
    rng = random.Random(24)
    pieces = [b"a", b",", b'"', b'""', b"\r", b"\n", b"\r\n", b" ", b"\xff", b"1"]
    p, one = tmp_path / "r.csv", tmp_path / "one.csv"
    for trial in range(300):
        monkeypatch.setattr(stream_module, "STREAM_BLOCK_BYTES", rng.choice([1, 7, 64, 4 << 20]))
        width = rng.choice([1, 2, 3])
        header = b",".join(b"c%d" % i for i in range(width)) + b"\n"
        body = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        p.write_bytes(header + body)
        arrow, stdlib = _read_both(p)
        assert arrow == stdlib, (trial, body)
        alone_rows: list[tuple[str, ...]] = []
        alone_ragged = 0
        for line in body.split(b"\n"):
            one.write_bytes(header + line)
            rows, ragged = _read_both(one)[1]
            alone_rows += rows
            alone_ragged += ragged
            assert len(rows) + ragged <= 1
        assert arrow == (alone_rows, alone_ragged), (trial, body)


def test_other_class_is_a_one_vs_rest_target_only() -> None:
    from dpsummary.data import ColumnSpec, Schema, target_kind

    x = ColumnSpec(name="x", kind="numeric", lower=0.0, upper=1.0)
    y = ColumnSpec(name="y", kind="categorical", categories=["no"], other_class=True)
    assert target_kind(Schema(columns=[x, y], target="y")) == "binary"
    with pytest.raises(ValueError, match="no target"):
        Schema(columns=[y, x], target="x")
    with pytest.raises(ValueError, match="exactly one category"):
        ColumnSpec(name="y", kind="categorical", categories=["no", "yes"], other_class=True)
    with pytest.raises(ValueError, match="other_class"):
        ColumnSpec(name="y", kind="numeric", lower=0.0, upper=1.0, other_class=True)


def test_one_vs_rest_with_the_listed_class_positive() -> None:
    """``other_class`` with ``positive`` naming the listed class (``--positive-class``): that
    class is 1, every other non-missing value 0, a missing field invalid."""
    from dpsummary.data import ColumnSpec, DataError, Schema, Transform, target_kind

    x = ColumnSpec(name="x", kind="numeric", lower=0.0, upper=1.0)
    y = ColumnSpec(name="y", kind="categorical", categories=["dead"], other_class=True, positive="dead")
    schema = Schema(columns=[x, y], target="y")
    assert target_kind(schema) == "binary"
    tf = Transform.from_schema(schema)
    assert tf.positive_class == "dead"
    enc, valid = tf._target(np.array(["dead", "alive", "unknown", "dead"], dtype=object), True)
    assert enc.tolist() == [1.0, 0.0, 0.0, 1.0] and valid.all()
    with pytest.raises(DataError, match="missing value"):
        tf._target(np.array(["dead", ""], dtype=object), True)
    with pytest.raises(ValueError, match="not a category"):
        ColumnSpec(name="y", kind="categorical", categories=["dead"], other_class=True, positive="alive")
    assert Transform.from_dict(tf.to_dict()) == tf  # the artifact's transform round-trips
    # A numeric class code matches by value ("1", "1.0", "1e0"), anything else is 0.
    one = ColumnSpec(name="y", kind="categorical", categories=["1"], other_class=True, positive="1")
    tf1 = Transform.from_schema(Schema(columns=[x, one], target="y"))
    enc1, _ = tf1._target(np.array(["1", "1.0", "1e0", "0", "0.0", "yes", "2"], dtype=object), True)
    assert enc1.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
