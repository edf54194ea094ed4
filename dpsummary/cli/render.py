"""What a release released and what it cost, in words: one renderer for ``dpsummary release``'s
table and ``dpsummary inspect``.

Everything here reads the artifact's signed claim or the ledger, both public, never the data.
The mechanism rows come from the claim alone, so the release table and ``inspect`` of the same
artifact say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SPENDING_COLUMNS", "SPENDING_NOTE", "AccountantSpending", "format_delta", "inspect_lines",
           "interval_calibration_warning", "mechanism_rows", "prior_text", "public_input_rows", "size_label",
           "source_spending", "spending_rows"]

Row = tuple[str, str]


def _num(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def _gaussian(sigma: Any, sensitivity: Any, unit: str = "") -> str:
    """``noise multiplier s x L2 sensitivity c = noise sd s*c``, or the parts that are known."""
    if not isinstance(sigma, int | float):
        return "no noise recorded"
    if isinstance(sensitivity, int | float) and not isinstance(sensitivity, bool):
        sd = f" = noise sd {_num(sigma * sensitivity)}{unit}"
        return f"multiplier {_num(sigma)} x sensitivity {_num(sensitivity)}{sd}"
    return f"multiplier {_num(sigma)} x sensitivity {sensitivity}"


def _stage1_rows(mech: dict[str, Any]) -> list[Row]:
    """The Gaussian releases a release may make besides its main mechanism (one release each)."""
    parts = (
        ("count_noise_multiplier", "record count", "sensitivity 1, noise sd {sd} records"),
        ("preprocessing_noise_multiplier", "schema estimation", "counts scaled to sensitivity 1"),
        ("quality_noise_multiplier", "data-quality counts", "counts scaled to sensitivity 1"),
    )
    rows: list[Row] = []
    for key, label, what in parts:
        sigma = mech.get(key)
        if isinstance(sigma, int | float):
            rows.append((label, f"1 Gaussian, multiplier {_num(sigma)}: {what.format(sd=_num(sigma))}"))
        else:
            rows.append((label, "not released (public, or no budget share)"))
    return rows


def _first(mech: dict[str, Any], i: int) -> Any:
    sigmas = mech.get("noise_multipliers") or []
    return sigmas[i][0] if i < len(sigmas) and sigmas[i] else None


def _linear_moment_rows(mech: dict[str, Any]) -> list[Row]:
    """Linear regression with sigma estimated (issue 51): the two Gaussian releases."""
    bounds = mech.get("bounds") or {}
    single = mech.get("single_gaussian_noise_multiplier")
    return [
        ("mechanism", "noise-aware-newton (linear regression, sigma estimated): two Gaussian releases of sums over "
                      "every record (no sampling): the moment matrix z z^T (count, X^T X, X^T y, y^T y), then the vector "
                      "[w clip(r), r^2 / s] (X^T r and the residual sum of squares), each record's part clipped"),
        ("anchor round", f"{_gaussian(_first(mech, 0), bounds.get('moment_bound'))}: z = [1, x, y]"),
        ("anchored round", f"{_gaussian(_first(mech, 1), bounds.get('residual_vector_bound'))}: w = [1, x], "
                           f"r = y - w . anchor clipped to +-{_num(bounds.get('residual_clip'))} (r^2 at "
                           f"{_num(bounds.get('residual_range'))}^2, s = {_num(bounds.get('square_scale'))})"),
        ("noise multiplier sigma", f"{_num(single)}: the 2 releases compose to one Gaussian of this multiplier"),
        ("posterior", "noise-aware Gaussian of (coefficients, log_sigma): the statistics' noise integrated out by "
                      "multiple imputation (post-processing, no privacy cost)"),
    ]


def _noise_aware_rows(mech: dict[str, Any]) -> list[Row]:
    if mech.get("statistic") == "moments":
        return _linear_moment_rows(mech)
    rounds = mech.get("rounds") or []
    sigmas = mech.get("noise_multipliers") or []
    schedule = (mech.get("schedule") or {}).get("rounds") or []
    rows: list[Row] = [(
        "mechanism",
        f"noise-aware-newton: {len(rounds)} rounds; each adds Gaussian noise once to the sums over every "
        "record (no sampling) of the clipped scores and of the clipped curvatures",
    )]
    count = mech.get("count_range")
    sched = mech.get("schedule") or {}
    if isinstance(count, dict):
        rows.append((
            "count clip",
            f"1 Gaussian histogram of the count over public bins, {_gaussian(count.get('noise_multiplier'), 1)} "
            f"(share {_num(sched.get('count_range_share'))}): clip bound {_num(count.get('clip_bound'))} (the bin edge "
            f"of its noisy {_num(100 * (sched.get('count_range_quantile') or 0))}% quantile; the schema's bound "
            f"{_num(count.get('schema_bound'))})",
        ))
    for i, bounds in enumerate(rounds):
        s_sigma, c_sigma = (list(sigmas[i]) + [None, None])[:2] if i < len(sigmas) else (None, None)
        share = f" (shares {', '.join(_num(x) for x in schedule[i])})" if i < len(schedule) else ""
        rows.append((
            f"round {i + 1}",
            f"score: {_gaussian(s_sigma, bounds.get('score_bound'))}; "
            f"curvature: {_gaussian(c_sigma, bounds.get('curvature_bound'))}{share}",
        ))
    if sched.get("posterior") == "imputed":
        rows.append((
            "posterior",
            f"noise-aware Gaussian of the last round with the curvature's noise integrated out "
            f"({sched.get('imputations')} imputed curvatures"
            + (", each kept at its own trace" if sched.get("imputed_spectrum") == "trace" else "")
            + (f", projected off {len(mech['exact_relations'])} exact one-hot relation(s)"
               if sched.get("relations") and mech.get("exact_relations") else "")
            + (", drawn on the one-hot support of the curvature"
               if sched.get("curvature_support") and mech.get("curvature_support") else "")
            + "; post-processing, no privacy cost)"
            + ("" if sched.get("expansion") is None else
               ", and the last Newton step's expansion error (widened along the step)"),
        ))
    single = mech.get("single_gaussian_noise_multiplier")
    if isinstance(single, int | float):
        rows.append((
            "noise multiplier sigma",
            f"{single:.4f}: the {2 * len(rounds) + isinstance(count, dict)} releases compose to one Gaussian of this multiplier "
            "(share s: multiplier sigma / sqrt(s))",
        ))
    return rows


def _dp_psvi_rows(mech: dict[str, Any]) -> list[Row]:
    steps, q, sigma = mech.get("steps"), mech.get("sample_rate"), mech.get("noise_multiplier")
    rows: list[Row] = [
        ("mechanism", f"dp-psvi: {steps} steps; each Poisson-samples every record with rate q = {_num(q)} and "
                      "releases the sum of the sampled records' clipped log-likelihood vectors with Gaussian noise"),
        (f"steps 1..{steps}", f"each: {_gaussian(sigma, 'C_t (the clip norm of step t)')}, so noise sd "
                              f"{_num(sigma)} x C_t; C_t by the public rule: {mech.get('clip_norm_rule')}"),
    ]
    if isinstance(sigma, int | float):
        rows.append(("noise multiplier sigma", f"{sigma:.4f} (every step)"))
    init = mech.get("initialisation")
    if isinstance(init, dict):
        rows.append(("initialisation", f"1 Gaussian release of per-column histograms: noise multiplier "
                                       f"{_num(init.get('noise_multiplier'))} x L2 sensitivity 1 (counts scaled)"))
    return rows


def _dp_bb_psvi_rows(mech: dict[str, Any]) -> list[Row]:
    steps, q, sigma, clip = mech.get("steps"), mech.get("sample_rate"), mech.get("noise_multiplier"), mech.get("clip_norm")
    rows: list[Row] = [
        ("mechanism", f"dp-bb-psvi: {steps} steps; each Poisson-samples every record with rate q = {_num(q)} and "
                      f"releases the sum of the sampled records' statistics (dimension "
                      f"{mech.get('statistic_dimension')}, clipped) with Gaussian noise"),
        (f"steps 1..{steps}", f"each: {_gaussian(sigma, clip)}"),
    ]
    if isinstance(sigma, int | float):
        rows.append(("noise multiplier sigma", f"{sigma:.4f} (every step)"))
    return rows


def _kd_tree_rows(mech: dict[str, Any]) -> list[Row]:
    levels, sigma = mech.get("levels"), mech.get("noise_multiplier")
    rows: list[Row] = [
        ("mechanism", f"dp-kd-tree: {levels} levels; each releases the record counts of that level's nodes "
                      f"(every record in one node) with Gaussian noise; a node splits when its noisy count is at "
                      f"least {_num(mech.get('split_threshold'))} sigma, a leaf is kept at "
                      f"{_num(mech.get('keep_threshold'))} sigma"),
        (f"levels 1..{levels}", f"each: {_gaussian(sigma, 1.0, ' records')}"),
    ]
    if isinstance(sigma, int | float):
        rows.append(("noise multiplier sigma", f"{sigma:.4f} (every level)"))
    return rows


def _statistic_sensitivity(mech: dict[str, Any]) -> Any:
    """T's L2 sensitivity: the design radius times the target's bound (1 for a binary target)."""
    radius, bound = mech.get("design_radius"), mech.get("target_bound", 1.0)
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (radius, bound))
    return radius * bound if ok else radius


def _cells_rows(mech: dict[str, Any]) -> list[Row]:
    domain = mech.get("domain") or {}
    share = mech.get("count_share")
    rows: list[Row] = [
        ("mechanism", f"noise-aware-cells: one Gaussian mechanism over every record (no sampling) releases the record "
                      f"counts of the {domain.get('cells')} public feature cells and T = sum over records of [1, x] y"),
        ("cell counts", f"{_gaussian(mech.get('counts_noise_multiplier'), 1, ' records')} (share {_num(share)})"),
        ("T = sum [1, x] y", f"{_gaussian(mech.get('statistic_noise_multiplier'), _statistic_sensitivity(mech))}"),
        ("posterior", "noise-aware Gaussian with the latent cell counts integrated out by imputation "
                      "(post-processing, no privacy cost)"),
    ]
    single = mech.get("single_gaussian_noise_multiplier")
    if isinstance(single, int | float):
        rows.append(("noise multiplier sigma", f"{single:.4f}: the two releases are one Gaussian of this multiplier "
                                               "(counts at sigma / sqrt(share), T at sigma / sqrt(1 - share))"))
    return rows


def _objective_rows(mech: dict[str, Any]) -> list[Row]:
    """``noise-aware-objective``: the default's rows, with the last round read as what it was
    (objective perturbation's tilt, its output perturbation and the curvature at its output)."""
    rows = _noise_aware_rows(mech)
    rounds = mech.get("rounds") or []
    sigmas = mech.get("noise_multipliers") or []
    op = (mech.get("schedule") or {}).get("objective_perturbation") or {}
    rows[0] = ("mechanism", f"noise-aware-objective: {max(len(rounds) - 1, 0)} Newton round(s) (as the default's), "
                            "then objective perturbation over every record: the minimiser of the negative "
                            "log-likelihood plus a ridge plus a random tilt, and a noisy curvature sum at it")
    if rounds and len(sigmas) == len(rounds):
        last = f"round {len(rounds)}"
        tilt, curvature = (list(sigmas[-1]) + [None, None])[:2]
        text = (f"tilt: {_gaussian(tilt, rounds[-1].get('score_bound'))} (ridge {_num(op.get('ridge'))}, Jacobian term "
                f"{_num(op.get('jacobian_log_ratio'))}; output perturbation at multiplier "
                f"{_num(op.get('output_multiplier'))} of the solver's tolerance); curvature at its output: "
                f"{_gaussian(curvature, rounds[-1].get('curvature_bound'))}; accounted by RDP only")
        rows = [("objective perturbation", text) if label == last else (label, value) for label, value in rows]
    return rows


_MECHANISM_ROWS = {
    "noise-aware-newton": _noise_aware_rows,
    "noise-aware-objective": _objective_rows,
    "dp-psvi": _dp_psvi_rows,
    "dp-bb-psvi": _dp_bb_psvi_rows,
    "dp-kd-tree": _kd_tree_rows,
    "noise-aware-cells": _cells_rows,
}


def mechanism_rows(claim: dict[str, Any]) -> list[Row]:
    """What each mechanism of the release released (rounds, steps or levels; each one's noise
    multiplier, L2 sensitivity and noise sd), read from the artifact's signed claim only.

    The same rows make ``dpsummary release``'s table and ``dpsummary inspect``. A mechanism
    name this version does not know is shown with its scalar claim fields, never hidden."""
    mech = claim.get("mechanism") or {}
    name = mech.get("name")
    render = _MECHANISM_ROWS.get(name or "")
    if render is not None:
        rows = render(mech)
    else:
        scalars = ", ".join(f"{k} {_num(v)}" for k, v in mech.items() if isinstance(v, int | float | str) and k != "name")
        rows = [("mechanism", f"{name} (not described by this dpsummary version): {scalars}")]
    return [*rows, *_stage1_rows(mech), *_interval_calibration_rows(claim)]


def _interval_calibration_rows(claim: dict[str, Any]) -> list[Row]:
    """The mechanism's record of what its intervals are validated on (dpsummary.caveats): one
    row when it has a caveat (also for a dp-psvi artifact that predates the record)."""
    from ..caveats import interval_calibration

    caveat = interval_calibration(claim)
    if caveat is None:
        return []
    return [("interval calibration", f"{caveat.get('status')}: {caveat.get('reason')}; validated on: "
                                     f"{caveat.get('validated_on', 'not recorded')}; evidence: {caveat.get('evidence')}")]


def interval_calibration_warning(claim: dict[str, Any]) -> str | None:
    """``warning: <mechanism>'s intervals are NOT validated on real tables ...`` (one line), or
    None when the release's mechanism records no caveat (dpsummary.caveats)."""
    from ..caveats import warning_text

    text = warning_text(claim)
    return None if text is None else f"warning: {text}"


def format_delta(delta: Any) -> str:
    """A delta as people write it (``1e-11``, not ``1.0000000000000001e-11``): 3 significant digits."""
    return f"{delta:.3g}" if isinstance(delta, int | float) and not isinstance(delta, bool) else str(delta)


def size_label(mechanism: str | None) -> str:
    """The release table's label for the number of pseudopoints: a kd-tree keeps one per leaf
    whose noisy count survived, so ``--size`` does not set it there."""
    if mechanism == "dp-kd-tree":
        return "pseudopoints M (kept kd-tree leaves; --size does not apply)"
    return "pseudopoints M (--size)"


def prior_text(model: dict[str, Any], param_names: list[str] | None) -> str:
    """The parameter prior the artifact's model declares, as every sampler uses it:
    ``N(mu, s^2 I)`` with the non-zero entries of ``prior_mean`` named (a Poisson release's
    prior is centred at its noisy log mean count, for instance)."""
    scale = model.get("prior_scale")
    mean = model.get("prior_mean")
    if not isinstance(mean, list) or not any(isinstance(m, int | float) and m != 0 for m in mean):
        return f"prior N(0, {_num(scale)}^2 I)"
    names = param_names if isinstance(param_names, list) and len(param_names) == len(mean) else [
        f"theta[{i}]" for i in range(len(mean))]
    shown = ", ".join(f"{n} {_num(m)}" for n, m in zip(names, mean, strict=True) if m != 0)
    return f"prior N(mu, {_num(scale)}^2 I), mu: {shown}, 0 elsewhere"


def public_input_rows(inputs: Any) -> list[Row]:
    """The claim's ``public_inputs`` in words, one row each (what the release took as public)."""
    if not isinstance(inputs, dict):
        return [("public inputs", str(inputs))]
    rows: list[Row] = []
    for key, value in inputs.items():
        if key == "record_count_public":
            continue  # folded into the record count's row
        if key == "record_count":
            rows.append(("record count", "not public (released with noise)" if value is None
                         else f"public: {value:,}" if isinstance(value, int) else str(value)))
        elif key == "schema":
            if value is None:
                rows.append(("schema", "not public (estimated privately)"))
            else:
                cols = value.get("columns", []) if isinstance(value, dict) else []
                names = [str(c.get("name")) for c in cols if isinstance(c, dict)]
                rows.append(("schema", f"public, {len(names)} columns: {', '.join(names)}"))
        elif key == "target" and isinstance(value, dict):
            listed = ", ".join(str(c) for c in value.get("categories", []))
            rows.append(("target", f"public (--positive-class): {value.get('name')!s}, 1 = {listed}, 0 = any other value"
                         if value.get("positive") is not None else f"public: {value}"))
        elif key == "delta_rule" and isinstance(value, dict) and "max_delta_times_n_max" in value:
            rows.append(("delta rule", f"delta <= {_num(value['max_delta_times_n_max'])} / n_max"))
        elif isinstance(value, int) and not isinstance(value, bool):
            rows.append((key.replace("_", " "), f"{value:,}"))
        elif isinstance(value, dict):
            rows.append((key.replace("_", " "), ", ".join(f"{k} {_num(v)}" for k, v in value.items())))
        else:
            rows.append((key.replace("_", " "), _num(value)))
    return rows


def inspect_lines(body: dict[str, Any], claim: dict[str, Any]) -> list[str]:
    """The lines of ``dpsummary inspect`` after its first: the interval-calibration warning (only
    when the mechanism records a caveat, :func:`interval_calibration_warning`), model and prior,
    privacy claim, what each mechanism released, budget split, data source and public inputs. Read from the signed
    body and claim only, so the display cannot disagree with what was signed."""
    summary = body.get("summary") or {}
    model = summary.get("model") or {}
    weights = summary.get("weights") or []
    names = body.get("param_names")
    software = body.get("software") or {}
    # The caveat first, where nobody scrolls past it; the full record is in the mechanism rows.
    from ..caveats import warning_text

    caveat = warning_text(claim)
    lines = [f"  WARNING: {caveat}"] if caveat else []
    lines.append(f"  created {body.get('created')} by dpsummary {software.get('dpsummary')}")
    head = f"  {summary.get('method')} summary: {len(weights)} weighted pseudopoints, model {model.get('name')}"
    if "n_components" in model:  # a mixture: fitted by weighted VI, no Gaussian parameter prior
        process = {"dirichlet_distribution": "Dirichlet", "dirichlet_process": "Dirichlet process (stick-breaking)"}
        lines.append(f"{head} with {model.get('n_components')} components over {model.get('num_features')} "
                     f"numeric columns, prior: {process.get(str(model.get('process')), model.get('process'))} "
                     f"weights ({model.get('process')}), Normal-Wishart components")
    else:
        lines.append(f"{head} with {len(names or [])} parameters, {prior_text(model, names)}")
        if isinstance(names, list) and names:
            lines.append("  parameters: " + ", ".join(str(n) for n in names)
                         + ("  (sigma = exp(log_sigma), the residual sd in model space)" if "log_sigma" in names else ""))
    eps = claim.get("epsilon") or {}
    lines.append("  privacy: epsilon " + ", ".join(f"{k} {v:.4g}" for k, v in eps.items())
                 + f"; delta {format_delta(claim.get('delta'))}; {claim.get('adjacency')}; "
                 f"{claim.get('sampling')} sampling")
    lines.extend(f"  {label}: {text}" for label, text in mechanism_rows(claim))
    split = claim.get("budget_split") or {}
    lines.append("  budget split: " + ", ".join(f"{k} {v:.4g}" for k, v in split.items()))
    lines.append(f"  data source: {claim.get('source_id')}")
    lines.append("  public inputs:")
    lines.extend(f"    {label}: {text}" for label, text in public_input_rows(claim.get("public_inputs")))
    return lines


# ---- spending -------------------------------------------------------------------------------
#: Why the source's composed total can read below this release's own epsilon (truthful for this
#: code: the release's epsilon is at the release's delta, the source's at the policy's total_delta;
#: see dpsummary.release.plan_public and dpsummary.ledger's charging rule).
SPENDING_NOTE = (
    "Why a source total can read below this release's own epsilon: the release is stated at its own "
    "delta, the source's total at the policy's larger total_delta (at a larger delta the same noise "
    "gives a smaller epsilon), and the ledger composes all the source's Gaussian events under one "
    "accountant, which adds up to less than the sum of the parts (RDP and PLD composition is "
    "sub-additive). Only the accountant of record's budget is enforced."
)


@dataclass(frozen=True)
class AccountantSpending:
    """One accountant's view of a release: its own cost and the source's running total."""

    accountant: str
    of_record: bool
    release_epsilon: float
    release_delta: float
    #: The source's composed totals; None when not composed here (PRV unless it is the
    #: accountant of record: slower; ``dpsummary audit`` composes it).
    before: float | None
    after: float | None
    total_delta: float
    total_epsilon: float
    active_holds: float

    @property
    def left(self) -> float | None:
        """The budget left: the policy's total minus the composed total and active holds."""
        return None if self.after is None else self.total_epsilon - self.after - self.active_holds

    def as_dict(self) -> dict[str, Any]:
        return {"accountant": self.accountant, "of_record": self.of_record,
                "release": {"epsilon": self.release_epsilon, "delta": self.release_delta},
                "source_before": {"epsilon": self.before, "delta": self.total_delta},  # None: not composed
                "source_after": {"epsilon": self.after, "delta": self.total_delta},
                "budget_left": {"epsilon": self.left, "of": self.total_epsilon, "delta": self.total_delta,
                                "enforced": self.of_record}}


#: Column headers of :func:`spending_rows`.
SPENDING_COLUMNS = ("accountant", "this release", "source total: before -> after", "budget left")


def spending_rows(spending: list[AccountantSpending]) -> list[tuple[str, str, str, str]]:
    """One row per accountant (:data:`SPENDING_COLUMNS`): this release's cost, the source's
    composed total before and after it, and the budget left, each with its delta. Explain them
    with :data:`SPENDING_NOTE`."""
    rows = []
    for s in spending:
        name = s.accountant.upper() + (" (of record)" if s.of_record else "")
        cost = f"{s.release_epsilon:.4f} (delta {s.release_delta:.3g})"
        if s.before is None or s.after is None or s.left is None:
            rows.append((name, cost, "see `dpsummary audit`", "-"))
            continue
        left = f"{s.left:.4f} of {s.total_epsilon:g} (delta {s.total_delta:.3g})"
        if s.active_holds > 0:
            left += f"; {s.active_holds:.4f} held by releases in progress"
        if not s.of_record:
            left += "; not enforced"
        rows.append((name, cost, f"{s.before:.4f} -> {s.after:.4f} (delta {s.total_delta:.3g})", left))
    return rows


def source_spending(
    *,
    ledger_path: Any,
    public_key: Any,
    source_id: str,
    release_id: str,
    policy: Any,
    release_epsilons: dict[str, float],
    release_delta: float,
    composed: tuple[str, ...],
) -> list[AccountantSpending]:
    """Each accountant's line for a finished release (one per key of ``release_epsilons``), from
    ONE verified read of the ledger: under each accountant in ``composed``, the source's composed total with every charged event (after) and without this release's
    entries (before), both at the policy's ``total_delta`` by the ledger's own computation
    (:func:`dpsummary.ledger.spent_in_entries`). Composition is not additive, so "before" is
    composed from the ledger, not subtracted. Releases of the same source that ran concurrently
    count in both."""
    from ..ledger import LedgerError, read_ledger, spent_in_entries

    state = read_ledger(ledger_path, public_key)
    if state.errors:
        raise LedgerError(f"ledger {ledger_path} fails verification: {state.errors[0].message}")
    others = [e for e in state.entries if e["release_id"] != release_id]
    after = spent_in_entries(state.entries, source_id, delta=policy.total_delta, accountants=composed)  # type: ignore[arg-type]
    before = spent_in_entries(others, source_id, delta=policy.total_delta, accountants=composed)  # type: ignore[arg-type]
    order = sorted(release_epsilons, key=lambda a: (a != policy.accountant, a not in composed, a))
    return [AccountantSpending(
        accountant=a, of_record=a == policy.accountant, release_epsilon=release_epsilons[a],
        release_delta=release_delta, before=before.composed.get(a), after=after.composed.get(a),
        total_delta=policy.total_delta, total_epsilon=policy.total_epsilon, active_holds=after.active_holds,
    ) for a in order]
