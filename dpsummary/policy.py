"""Release policies: a TOML file that fixes the privacy budget and the public facts a release uses.

``load_policy(path)`` parses and validates a policy; every problem raises :class:`PolicyError`
with a one-line message (malformed TOML, unknown keys, out-of-range values, unknown model
names, a schema that does not validate). ``default_policy()`` loads the packaged default
``dpsummary/resources/default_policy.toml`` (``policies/default.toml`` in the checkout is the same file,
kept for reading); it never depends on the current directory, so the budget a command applies
cannot change with where it is run. Any other policy must be named with ``--policy``.

Everything in a policy is treated as PUBLIC information: it may appear in artifacts and
ledgers. In particular ``n_max``, ``record_count`` (when ``record_count_public``) and the
``schema`` bounds/categories must not be derived from the private data itself.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from .errors import FixedError

__all__ = [
    "BudgetSplit",
    "DataQuality",
    "DeltaRule",
    "Policy",
    "PolicyError",
    "default_policy",
    "default_policy_path",
    "load_policy",
    "parse_policy",
    "source_id_from_path",
]


class PolicyError(FixedError, ValueError):
    """A policy that cannot be loaded or that forbids the requested release (one line; its
    ``fix``, when set, is the advice the CLI prints after it)."""


#: Largest n_max a policy may set (see ``Policy.n_max``).
MAX_N_MAX = 10**12


class DeltaRule(BaseModel):
    """``delta <= max_delta_times_n_max / n_max`` (delta far below 1/N, from a public bound)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_delta_times_n_max: float = Field(0.1, gt=0, le=1)


class BudgetSplit(BaseModel):
    """Fractions of a release's epsilon for the DP count, DP preprocessing, the data-quality
    counts, the DP initialisation and optimisation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: float = Field(0.05, ge=0, le=1)
    preprocessing: float = Field(0.15, ge=0, le=1)
    #: Noisy counts of the records each public data-quality rule touched (imputed, sent to the
    #: "other" category, dropped). Absent (0): no counts are released, and the release never
    #: refuses on data quality (the per-record rules still apply).
    quality: float = Field(0.0, ge=0, lt=1)
    #: DP per-column histograms for DP-PSVI's initial pseudopoints. Absent (0): the uniform
    #: public start. When the release's model does not use it, its share goes to optimisation.
    initialisation: float = Field(0.0, ge=0, lt=1)
    optimisation: float = Field(0.8, gt=0, le=1)

    @model_validator(mode="after")
    def _sums_to_one(self) -> BudgetSplit:
        total = self.count + self.preprocessing + self.quality + self.initialisation + self.optimisation
        if not math.isclose(total, 1.0, rel_tol=0, abs_tol=1e-9):
            raise ValueError(f"budget_split fractions must sum to 1 (they sum to {total:g})")
        return self

    def normalised(
        self, *, count: bool = True, preprocessing: bool = True, initialisation: bool = True,
        quality: bool = True,
    ) -> dict[str, float]:
        """Fractions for the stages that actually run (a public count or schema needs no budget),
        rescaled to sum to 1. Keys: ``count``, ``preprocessing``, ``quality``, ``initialisation``,
        ``optimisation``."""
        parts = {
            "count": self.count if count else 0.0,
            "preprocessing": self.preprocessing if preprocessing else 0.0,
            "quality": self.quality if quality else 0.0,
            "initialisation": self.initialisation if initialisation else 0.0,
            "optimisation": self.optimisation,
        }
        s = sum(parts.values())
        return {k: v / s for k, v in parts.items()}


class DataQuality(BaseModel):
    """Public per-record rules for values a record cannot use (see dpsummary.data). Every rule is
    total: a bad value never stops a release; it is imputed, bucketed or its record dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: A numeric feature that is missing or not a finite number: "impute" at the column's public
    #: centre, or "drop" the record.
    missing_numeric: Literal["impute", "drop"] = "impute"
    #: A categorical feature value outside the schema's categories (or missing): "other" (the
    #: all-zero one-hot vector), or "drop" the record.
    unseen_category: Literal["other", "drop"] = "other"
    #: Refuse (after the reservation, charged) when the noisy count of dropped records exceeds
    #: this fraction of the noisy count of records read. Needs ``budget_split.quality`` > 0.
    max_dropped_fraction: float = Field(default=0.5, gt=0, le=1)


class Policy(BaseModel):
    """A validated policy. See ``policies/default.toml`` for the meaning of every field."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    source_id: str | None = None
    total_epsilon: float = Field(gt=0, allow_inf_nan=False)
    total_delta: float = Field(gt=0, lt=1)
    max_epsilon_per_release: float = Field(gt=0, allow_inf_nan=False)
    min_records: int = Field(0, ge=0)
    # At most 10^12: the float64 slack reserved in every noisy sum and count is sized for
    # 2^41 records (dpsummary.private.noise.MAX_RECORDS, tested against this bound).
    n_max: int | None = Field(None, ge=1, le=MAX_N_MAX)
    delta_rule: DeltaRule = Field(default_factory=lambda: DeltaRule.model_validate({}))
    record_count_public: bool = False
    record_count: int | None = Field(None, ge=0)
    accountant: Literal["rdp", "prv", "pld"] = "rdp"
    allowed_models: list[str] = Field(
        default_factory=lambda: ["gaussian_mean", "linear", "logistic", "poisson"]
    )
    budget_split: BudgetSplit = Field(default_factory=lambda: BudgetSplit.model_validate({}))
    data_quality: DataQuality = Field(default_factory=lambda: DataQuality.model_validate({}))
    schema_spec: dict[str, Any] | None = Field(None, alias="schema")
    ledger: str | None = None

    _schema: Any = PrivateAttr(default=None)
    _base_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> Policy:
        if self.source_id is not None and (not self.source_id or self.source_id != self.source_id.strip()):
            raise ValueError("source_id must be non-empty without surrounding whitespace")
        if self.max_epsilon_per_release > self.total_epsilon:
            raise ValueError("max_epsilon_per_release exceeds total_epsilon")
        if self.n_max is None:
            raise ValueError("n_max (a public upper bound on the record count) is required for the delta rule")
        if self.record_count_public:
            if self.record_count is None:
                raise ValueError("record_count_public = true needs record_count")
            if self.record_count > self.n_max:
                raise ValueError("record_count exceeds n_max")
        elif self.record_count is not None:
            raise ValueError("record_count given but record_count_public is false")
        from .model_names import MODEL_NAMES

        unknown = [m for m in self.allowed_models if m not in MODEL_NAMES]
        if unknown:
            raise ValueError(
                f"unknown model {unknown[0]!r} in allowed_models; known: {', '.join(sorted(MODEL_NAMES))}"
            )
        if not self.allowed_models:
            raise ValueError("allowed_models is empty")
        if self.schema_spec is not None:
            from .data.schema import Schema

            try:
                self._schema = Schema.model_validate(self.schema_spec)
            except ValidationError as exc:
                raise _SchemaError(f"schema: {_first_error(exc)}", columns=_in_columns(exc)) from None
        return self

    # ------------------------------------------------------------------ derived, public facts

    @property
    def data_schema(self) -> Any:
        """The public :class:`dpsummary.data.Schema`, or None if the schema is not public."""
        return self._schema

    def max_delta(self) -> float:
        """Largest per-release delta: ``min(total_delta, max_delta_times_n_max / n_max)``."""
        assert self.n_max is not None
        return min(self.total_delta, self.delta_rule.max_delta_times_n_max / self.n_max)

    def resolve_delta(self, requested: float | None = None) -> float:
        """The release's delta: ``requested`` if within :meth:`max_delta`, else that maximum."""
        cap = self.max_delta()
        if requested is None:
            return cap
        if not (0 < requested < 1):
            raise PolicyError("delta must lie in (0, 1)")
        if requested > cap:
            raise PolicyError(
                f"delta {requested:.3g} exceeds the policy's maximum {cap:.3g} "
                f"(min of total_delta and {self.delta_rule.max_delta_times_n_max:g} / n_max)"
            )
        return requested

    def check_model(self, name: str) -> None:
        """Raise :class:`PolicyError` unless ``name`` is an allowed model."""
        if name not in self.allowed_models:
            raise PolicyError(
                f"model {name!r} is not allowed by the policy (allowed: {', '.join(self.allowed_models)})"
            )

    def ledger_path(self) -> Path | None:
        """The ledger named by the policy (relative paths are relative to the policy file)."""
        if self.ledger is None:
            return None
        p = Path(self.ledger).expanduser()
        if not p.is_absolute() and self._base_dir is not None:
            p = self._base_dir / p
        return p

    def public_inputs(self) -> dict[str, Any]:
        """The public facts a release relied on (recorded in the artifact's claim)."""
        return {
            "n_max": self.n_max,
            "record_count": self.record_count if self.record_count_public else None,
            "record_count_public": self.record_count_public,
            "schema": self.schema_spec,
            "delta_rule": {"max_delta_times_n_max": self.delta_rule.max_delta_times_n_max},
            "min_records": self.min_records,
        }


class _SchemaError(ValueError):
    """The policy's schema is invalid; ``columns`` when its first error is in a column block (the
    fix is then to fill that block in)."""

    def __init__(self, message: str, *, columns: bool) -> None:
        super().__init__(message)
        self.columns = columns


def _in_columns(exc: ValidationError) -> bool:
    errs = exc.errors()
    return bool(errs) and tuple(errs[0].get("loc", ()))[:1] == ("columns",)


#: The fix of an invalid [[schema.columns]] block.
SCHEMA_COLUMNS_FIX = ("fill in each [[schema.columns]] block of the policy (a kind, and bounds or categories, from "
                      "public knowledge; `dpsummary policy init DATA` writes the skeleton)")


def _fix_of(exc: ValidationError) -> str | None:
    """The fix of a policy that fails validation, read from the error's structure (never its text):
    a schema column block that is incomplete or wrong."""
    errs = exc.errors()
    cause = (errs[0].get("ctx") or {}).get("error") if errs else None
    return SCHEMA_COLUMNS_FIX if isinstance(cause, _SchemaError) and cause.columns else None


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors()
    if not errs:
        return "invalid"
    e = errs[0]
    loc = ".".join(str(x) for x in e.get("loc", ()) if x != "__root__")
    msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    if e.get("type") == "extra_forbidden":
        msg = "unknown key"
    elif e.get("type") == "missing":
        msg = "required key missing"
    text = f"{loc}: {msg}" if loc else msg
    return " ".join(text.split())


def parse_policy(data: dict[str, Any], *, base_dir: Path | None = None, name: str = "policy") -> Policy:
    """Validate an already-parsed policy mapping."""
    try:
        pol = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"invalid policy {name}: {_first_error(exc)}", fix=_fix_of(exc)) from None
    pol._base_dir = base_dir
    return pol


def load_policy(path: str | Path) -> Policy:
    """Load and validate a policy TOML file (one-line :class:`PolicyError` on any problem)."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise PolicyError(f"policy file not found: {p}", fix="pass an existing policy TOML with --policy "
                          "(`dpsummary policy init DATA` writes one)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy {p}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"malformed TOML in policy {p}: {' '.join(str(exc).split())}") from None
    return parse_policy(data, base_dir=p.resolve().parent, name=str(p))


def default_policy_path() -> Path:
    """The packaged ``dpsummary/resources/default_policy.toml``: one file, whatever the current
    directory (a ``policies/default.toml`` lying around never changes the budget silently)."""
    path = Path(__file__).resolve().parent / "resources" / "default_policy.toml"
    if not path.is_file():
        raise PolicyError(f"the packaged default policy is missing ({path}); reinstall dpsummary")
    return path


def default_policy() -> Policy:
    return load_policy(default_policy_path())


def source_id_from_path(path: str | Path) -> str:
    """A source id derived from a data file's NAME (not its content: a content hash would
    distinguish neighbouring datasets). Renaming the file starts a new budget, so production
    policies should set ``source_id`` explicitly."""
    return f"file:{Path(path).name}"
