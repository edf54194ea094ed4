"""The public domain rule of ``noise-aware-cells`` (dpsummary/cells/domain.py): which schemas it
applies to, how many cells, and the one-line refusals (with their fix) before any reservation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from release_support import ledger_lines, write_csv, write_policy

from dpsummary.cells.domain import MAX_CELLS, cell_domain, check_schema
from dpsummary.data import Schema, Transform
from dpsummary.errors import Refusal, ReleaseError
from dpsummary.plan import ReleaseRequest
from dpsummary.release import run_release


def napsu_cells_schema() -> Schema:
    """The NAPSU-MQ problem's discrete schema (benchmarks/calibration.py, napsu_adult_cells)."""
    return Schema.model_validate({"target": "income", "columns": [
        {"name": "age_bin", "kind": "numeric", "lower": 0.0, "upper": 4.0, "integer": True},
        {"name": "race", "kind": "categorical",
         "categories": ["Amer-Indian-Eskimo", "Asian-Pac-Islander", "Black", "Other"]},
        {"name": "sex", "kind": "categorical", "categories": ["Male"]},
        {"name": "income", "kind": "numeric", "lower": 0.0, "upper": 1.0, "integer": True}]})


def _schema(columns: list[dict[str, Any]]) -> Schema:
    return Schema.model_validate({"target": "y", "columns": [
        *columns, {"name": "y", "kind": "categorical", "categories": ["no", "yes"]}]})


def test_the_napsu_mq_schema_is_its_declared_domain_of_fifty_cells() -> None:
    schema = napsu_cells_schema()
    assert check_schema(schema) == 50
    domain = cell_domain(Transform.from_schema(schema), missing_numeric="impute", unseen_category="other")
    assert domain.num_cells == 50
    feats = domain.features()
    assert feats.shape == (50, 1 + 4 + 1)
    assert len({tuple(r) for r in feats.tolist()}) == 50  # every cell distinct
    # age: the integers 0..4 in model space (centre 2 is already a level: imputation adds none)
    assert sorted(set(feats[:, 0].tolist())) == [-1.0, -0.5, 0.0, 0.5, 1.0]
    # race: the four one-hot levels and the all-zero (White, and missing) level
    assert {tuple(r) for r in feats[:, 1:5].tolist()} == {(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0),
                                                         (0, 0, 0, 1)}
    assert domain.design_radius() == pytest.approx(math.sqrt(1 + 1 + 1 + 1))


def test_the_data_quality_rules_add_or_remove_their_levels() -> None:
    schema = _schema([{"name": "a", "kind": "numeric", "lower": 0, "upper": 1, "integer": True},
                      {"name": "c", "kind": "categorical", "categories": ["p", "q"]}])
    tf = Transform.from_schema(schema)
    # 0/1 plus the imputation centre 0.5 (model space 0) x two categories plus the zero level
    assert check_schema(schema) == 3 * 3
    full = cell_domain(tf, missing_numeric="impute", unseen_category="other")
    assert full.levels[0] == ((-1.0,), (1.0,), (0.0,))
    assert full.num_cells == 9
    dropped = cell_domain(tf, missing_numeric="drop", unseen_category="drop")
    assert dropped.num_cells == 2 * 2


def test_a_continuous_column_refuses_with_its_fix() -> None:
    schema = _schema([{"name": "x", "kind": "numeric", "lower": 0, "upper": 10}])
    with pytest.raises(ReleaseError, match="needs discrete features; column 'x'") as info:
        check_schema(schema)
    assert "integer = true" in info.value.fix and "noise-aware-newton" in info.value.fix
    assert "\n" not in str(info.value)


def test_a_domain_over_the_cap_refuses_with_its_fix() -> None:
    cats = [f"k{i}" for i in range(9)]  # 10 levels per column
    schema = _schema([{"name": f"c{j}", "kind": "categorical", "categories": cats} for j in range(3)])
    assert 10**3 > MAX_CELLS
    with pytest.raises(ReleaseError, match=f"more than {MAX_CELLS} cells") as info:
        check_schema(schema)
    assert "fewer levels" in info.value.fix
    # Just under the cap applies: 8 x 8 x 8 = 512.
    ok = _schema([{"name": f"c{j}", "kind": "categorical", "categories": cats[:7]} for j in range(3)])
    assert check_schema(ok) == 512


def test_a_wide_integer_range_refuses_without_listing_its_values() -> None:
    schema = _schema([{"name": "n", "kind": "numeric", "lower": 0, "upper": 10**9, "integer": True}])
    with pytest.raises(ReleaseError, match="more than"):
        check_schema(schema)


@pytest.mark.parametrize("case", ["no schema", "continuous", "too many cells", "real target"])
def test_refusals_come_before_any_reservation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """The release refuses on public facts before reading a record or writing the ledger."""
    import dpsummary.release as release_mod
    from dpsummary.private.source import PrivateSource

    def never(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the records were opened before a public refusal")

    monkeypatch.setattr(PrivateSource, "open", classmethod(never))
    monkeypatch.setattr(release_mod, "read_source", never)
    target = "real" if case == "real target" else "binary"
    data = write_csv(tmp_path / "d.csv", 300, seed=1, target=target)
    policy = write_policy(tmp_path / "p.toml", n=300, schema=case != "no schema", target_kind=target,
                          x1_integer=case != "continuous")
    if case == "too many cells":  # x1's 601 integers x x2's 4 levels
        policy.write_text(policy.read_text().replace("upper = 10\n", "upper = 600\n", 1))
    req = ReleaseRequest(data=data, epsilon=1.0, policy=policy, out=tmp_path / "o.json", ledger=tmp_path / "ledger.jsonl",
                         mechanism="noise-aware-cells", target="y")
    match = {"no schema": "needs a public schema", "continuous": "needs discrete features",
             "too many cells": "more than 512 cells", "real target": "Poisson regression of a count target only"}[case]
    with pytest.raises(Refusal, match=match) as info:
        run_release(req)
    assert info.value.kind == "public"
    assert info.value.fix
    assert ledger_lines(tmp_path) == []
    assert not (tmp_path / "o.json").exists()


def test_features_follow_the_product_order() -> None:
    schema = _schema([{"name": "a", "kind": "numeric", "lower": 0, "upper": 2, "integer": True},
                      {"name": "c", "kind": "categorical", "categories": ["p"]}])
    domain = cell_domain(Transform.from_schema(schema), missing_numeric="impute", unseen_category="other")
    # a in {0, 1, 2} -> {-1, 0, 1}; c in {p, other}; the last column varies fastest
    np.testing.assert_array_equal(domain.features(), [[-1, 1], [-1, 0], [0, 1], [0, 0], [1, 1], [1, 0]])
