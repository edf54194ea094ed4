"""The curator's utility report: how good is a release, compared with what else they could publish?

``dpsummary report ARTIFACT DATA.csv`` reads a release artifact and the *private* data it was
built from, and writes one self-contained HTML page (plots inlined as base64 PNG, no external
resources) comparing

* the full-data posterior (exact for conjugate models, Laplace otherwise) — the reference;
* the release's posterior (the same inference on the released weighted pseudopoints);
* non-private baselines of the same size M built on the same data (uniform subsample,
  lightweight coreset, PSVI pseudocoreset), and the prior.

**The report is computed from the private data and is NOT differentially private.** It is for
the curator only; publishing it (or any number in it) would leak information about the data
that the release's privacy claim does not cover. The page, the CLI and this docstring all say so.

The data is mapped through the release's *public* transform (from the artifact). Records that
transform cannot map (an invalid or missing target) are dropped and their number is reported;
invalid numeric feature values are imputed with the column's public centre, as in the release.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import html
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .inference import GaussianPosterior, prior_posterior
from .models import DTYPE, Model

WARNING = (
    "CURATOR-ONLY: this report is computed from the private data and is NOT differentially "
    "private. Do not publish it, share it, or quote its numbers; only the signed release "
    "artifact is covered by the privacy claim."
)

#: Non-private baselines built at the release's size M (names in dpsummary.constructors.REGISTRY).
DEFAULT_BASELINES: tuple[str, ...] = ("uniform", "lightweight", "psvi")
#: Parameters shown in the interval plot (the ones where the release differs most from the full
#: posterior, in full-posterior standard deviations); the table covers all of them.
MAX_PARAMS_PLOTTED = 40


@dataclass
class MethodResult:
    name: str
    label: str
    posterior: GaussianPosterior
    metrics: dict[str, float]
    seconds: float = 0.0
    note: str = ""


@dataclass
class ReportData:
    artifact: Path
    data: Path
    verified: bool
    keyid: str | None
    artifact_digest: str
    claim: dict[str, Any]
    method: str
    model: Model
    size: int
    param_names: list[str]
    records_total: int
    records_used: int
    reference: str
    full: GaussianPosterior
    results: list[MethodResult] = field(default_factory=list)
    #: The idealised floor at the release's epsilon and delta (:func:`dpsummary.metrics.idealised_floor`):
    #: the most an honest mechanism could show at this budget. None for models it does not cover.
    floor: Any = None

    @property
    def records_dropped(self) -> int:
        return self.records_total - self.records_used


def _metrics(model: Model, post: GaussianPosterior, full: GaussianPosterior, points: torch.Tensor,
             generator: torch.Generator, floor: Any = None) -> dict[str, float]:
    from .metrics import kl_report, predictive_scores, standardised_mean_error, trust_report

    out: dict[str, float] = dict(kl_report(post, full, prior_posterior(model)).as_dict())
    out["mean_error"] = standardised_mean_error(post, full)
    trust = trust_report(post, full, prior_posterior(model), floor=floor)
    out["mean_error_sd_median"] = trust.mean_error_sd_median
    out["mean_error_sd_max"] = trust.mean_error_sd_max
    out["coverage"] = trust.coverage
    out["width_ratio"] = trust.width_ratio
    out["effects_found"] = float(trust.effects_found)
    out["effects_wrong_sign"] = float(trust.effects_wrong_sign)
    if trust.width_vs_floor is not None:
        out["width_vs_floor"] = trust.width_vs_floor
    if trust.effects_vs_floor is not None:
        out["effects_vs_floor"] = trust.effects_vs_floor
    out.update(predictive_scores(model, post, points, generator=generator))
    out["expected_loglik"] = _expected_loglik(model, post, points, generator)
    return out


#: Posterior draws for the expected log-likelihood (the same number predictive_scores uses).
EXPECTED_LOGLIK_DRAWS = 200


def _expected_loglik(model: Model, post: GaussianPosterior, points: torch.Tensor,
                     generator: torch.Generator) -> float:
    """``E_theta[log p(y | theta)]`` per record under ``post`` (Monte Carlo over
    :data:`EXPECTED_LOGLIK_DRAWS` draws), averaged over ``points``.

    Why besides the log predictive density ``log E_theta p(y | theta)`` (``test_loglik``): under
    a misspecified model (an over-dispersed count table under Poisson regression) a wide
    posterior mixes many rates, and its predictive density beats the full-data posterior's,
    even the prior's can (bike_rentals, issue 36). The expected log-likelihood does not reward width (the log-likelihood is concave
    in a GLM's parameters, so by Jensen a wider posterior around the same mean scores lower), so
    the full-data posterior, centred at the in-sample optimum, scores best, as it should."""
    theta = post.sample(EXPECTED_LOGLIK_DRAWS, generator)
    return float(model.log_likelihood(points, theta).mean())


def build_report(
    artifact: str | Path,
    data: str | Path,
    *,
    public_key: Any = None,
    allow_unsigned: bool = False,
    baselines: tuple[str, ...] = DEFAULT_BASELINES,
    seed: int = 0,
    psvi_steps: int | None = None,
) -> ReportData:
    """Load the release and the private data, and compute every posterior and metric."""
    from . import data as dmod
    from .artifact import read_artifact
    from .constructors.base import Summary, fit
    from .experiment import make_constructor
    from .metrics import full_posterior, summary_posterior

    artifact, data = Path(artifact), Path(data)
    body, claim, info = read_artifact(artifact, public_key, allow_unsigned=allow_unsigned)
    sdict = body.get("summary")
    if not isinstance(sdict, dict) or not isinstance(sdict.get("transform"), dict):
        raise dmod.DataError("the artifact carries no summary with a public transform")
    summary = Summary.from_dict(sdict)
    model = summary.model
    if not getattr(model, "parameter_draws", True):
        # The report compares Gaussian posteriors over the parameters; a mixture's is multimodal.
        raise dmod.DataError(f"dpsummary report compares GLM and BNN releases with their full-data posterior; a "
                             f"{model.name} release is compared in benchmarks/mixtures.py (held-out log predictive "
                             "density, components after matching)")
    tf = dmod.Transform.from_dict(sdict["transform"])
    # Drop what cannot be mapped (invalid targets); impute invalid numerics, as the release does.
    tf = dataclasses.replace(tf, invalid_numeric="missing", invalid_target="drop")
    table = dmod.read_csv(data, private=True)
    points = tf.to_points(table).to(DTYPE)
    if points.shape[1] != model.point_dim:
        raise dmod.DataError("the data does not match the release's model")
    if points.shape[0] == 0:
        raise dmod.DataError("no record of the data can be mapped through the release's transform")
    names = body.get("param_names")
    if not (isinstance(names, list) and len(names) == model.param_dim):
        names = model.param_names(tf.feature_names)
        if len(names) != model.param_dim:
            names = [f"theta{i}" for i in range(model.param_dim)]

    full = full_posterior(model, points)
    floor = _floor(model, points, full, claim, seed)
    rep = ReportData(
        artifact=artifact, data=data, verified=bool(info.get("verified")), keyid=info.get("keyid"),
        artifact_digest=str(info.get("artifact_digest", "")), claim=claim, method=summary.method,
        model=model, size=summary.size, param_names=[str(n) for n in names],
        records_total=table.num_rows, records_used=int(points.shape[0]),
        reference="exact" if model.conjugate else "Laplace", full=full, floor=floor,
    )

    def add(name: str, label: str, post: GaussianPosterior, seconds: float = 0.0, note: str = "") -> None:
        mets = _metrics(model, post, full, points, torch.Generator().manual_seed(seed + 1), floor)
        rep.results.append(MethodResult(name, label, post, mets, seconds, note))

    add("full", f"full data ({rep.reference})", full, note="reference")
    add("release", f"release ({summary.method}, M={summary.size})",
        summary_posterior(model, summary.points, summary.weights), note="the published summary")
    for method in baselines:
        start = time.perf_counter()
        try:
            constructor = make_constructor(method, steps=psvi_steps if method == "psvi" else None)
            s = fit(constructor, points, model, summary.size, generator=torch.Generator().manual_seed(seed))
            post = summary_posterior(model, s.points, s.weights)
        except Exception as exc:  # noqa: BLE001 - one failed baseline must not sink the report
            rep.results.append(MethodResult(method, f"{method} (non-private, M={summary.size})",
                                            prior_posterior(model), {}, 0.0, f"failed: {type(exc).__name__}"))
            continue
        add(method, f"{method} (non-private, M={summary.size})", post, time.perf_counter() - start,
            "non-private baseline")
    add("prior", "prior (empty summary)", prior_posterior(model), note="no data")
    return rep


def _floor(model: Model, points: torch.Tensor, full: GaussianPosterior, claim: dict[str, Any], seed: int) -> Any:
    """The idealised floor (issue 27) at the claim's epsilon (accountant of record) and delta, for
    the models whose per-record scores and curvatures it needs (GLMs, linear, Gaussian mean)."""
    from .metrics import idealised_floor
    from .models import GLM, GaussianMean, LinearRegression

    if not isinstance(model, GLM | LinearRegression | GaussianMean):
        return None
    eps = claim.get("epsilon")
    accountant = str(claim.get("accountant_of_record", "rdp"))
    delta = claim.get("delta")
    value = eps.get(accountant) if isinstance(eps, dict) else eps
    if not (isinstance(value, float | int) and isinstance(delta, float | int) and value > 0 and 0 < delta < 1):
        return None
    return idealised_floor(model, points, full, epsilon=float(value), delta=float(delta), accountant=accountant,
                           generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------- plots


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _interval_plot(rep: ReportData) -> str:
    """Marginal 95% intervals per parameter: full vs release vs baselines."""
    import matplotlib.pyplot as plt

    full = rep.full
    sd_full = torch.sqrt(torch.diagonal(full.cov))
    release = next(r for r in rep.results if r.name == "release").posterior
    gap = ((release.mean - full.mean).abs() / sd_full).tolist()
    d = len(gap)
    if d > MAX_PARAMS_PLOTTED:
        shown = sorted(sorted(range(d), key=lambda i: -gap[i])[:MAX_PARAMS_PLOTTED])
    else:
        shown = list(range(d))
    methods = [r for r in rep.results if r.name != "prior" and r.metrics]
    fig, ax = plt.subplots(figsize=(11.0, 1.2 + 0.34 * len(shown) * max(1.0, len(methods) / 4)))
    offsets = torch.linspace(-0.3, 0.3, len(methods)).tolist() if len(methods) > 1 else [0.0]
    colors = {"full": "black", "release": "tab:red"}
    palette = iter(["tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:gray"])
    for off, r in zip(offsets, methods, strict=True):
        mean = r.posterior.mean
        sd = torch.sqrt(torch.diagonal(r.posterior.cov))
        ys = [len(shown) - 1 - j + off for j in range(len(shown))]
        color = colors.get(r.name) or next(palette)
        ax.errorbar([float(mean[i]) for i in shown], ys, xerr=[1.96 * float(sd[i]) for i in shown],
                    fmt="o", markersize=3, capsize=2, color=color, label=r.label,
                    linewidth=2.0 if r.name in colors else 1.0)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([rep.param_names[i][:40] for i in reversed(shown)], fontsize=7)
    ax.set_xlabel("parameter value (model space): posterior mean and 95% interval")
    title = "Marginal posteriors per parameter"
    if len(shown) < d:
        title += f" ({len(shown)} of {d}: those where the release's mean is furthest from the full posterior's)"
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)


def _kl_plot(rep: ReportData) -> str:
    import matplotlib.pyplot as plt

    rows = [r for r in rep.results if r.name != "full" and r.metrics]
    labels = [r.label for r in rows]
    fwd = [max(r.metrics["forward"], 1e-12) for r in rows]
    rev = [max(r.metrics["reverse"], 1e-12) for r in rows]
    fig, ax = plt.subplots(figsize=(9.5, 1.0 + 0.55 * len(rows)))
    ys = list(range(len(rows)))
    ax.barh([y - 0.2 for y in ys], fwd, height=0.38, label="KL(summary || full)", color="tab:blue")
    ax.barh([y + 0.2 for y in ys], rev, height=0.38, label="KL(full || summary)", color="tab:orange")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("KL divergence to the full-data posterior (log scale; smaller is better)")
    ax.set_title("KL to the full-data posterior", fontsize=9)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


# ----------------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1000px; color: #222; line-height: 1.4; padding: 0 1em; }
.warning { background: #b00020; color: #fff; padding: 1em 1.2em; border-radius: 6px;
           font-weight: bold; font-size: 1.05em; margin: 1em 0; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; }
tr.release td { background: #fff3f3; font-weight: bold; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.meta td { text-align: left; } .small { color: #555; font-size: 0.85em; }
.wide { overflow-x: auto; }  /* the metrics table has more columns than the page is wide */
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    return html.escape(str(v))


def render_html(rep: ReportData) -> str:
    """The self-contained page (every image is an inline data URI)."""
    import matplotlib

    from .cli.render import format_delta, mechanism_rows, prior_text

    matplotlib.use("Agg")
    e = html.escape
    eps = rep.claim.get("epsilon", {})
    eps_text = ", ".join(f"{k.upper()} {v:.4g}" for k, v in eps.items()) if isinstance(eps, dict) else _fmt(eps)
    meta = [
        ("artifact", f"{rep.artifact.name} ({rep.artifact_digest[:23]}...)"),
        ("signature", f"verified, key {rep.keyid}" if rep.verified else "NOT VERIFIED (--allow-unsigned)"),
        ("privacy claim", f"epsilon {eps_text}; delta {format_delta(rep.claim.get('delta'))}"),
        ("summary", f"{rep.method}, M = {rep.size} pseudopoints, model {rep.model.name} (d = {rep.model.param_dim})"),
        ("prior", prior_text({"prior_scale": float(rep.model.prior_scale),
                              "prior_mean": [float(x) for x in rep.model.prior_mean]}, rep.param_names)),
        # What each mechanism released, in the words of `dpsummary inspect` (one renderer).
        *mechanism_rows(rep.claim),
        ("private data", f"{rep.data.name}: {rep.records_total} records read, {rep.records_used} mapped "
                         f"through the release's public transform, {rep.records_dropped} dropped "
                         "(target missing or invalid)"),
        ("reference posterior", f"{rep.reference} on all {rep.records_used} mapped records"),
        ("generated", _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")),
    ]
    cols = [("forward", "KL(summary||full)"), ("reverse", "KL(full||summary)"),
            ("forward_normalised", "KL fwd / prior"), ("reverse_normalised", "KL rev / prior"),
            ("mean_error", "std. mean error"), ("mean_error_sd_median", "mean error, sds (median)"),
            ("mean_error_sd_max", "mean error, sds (max)"), ("coverage", "95% coverage of full mean"),
            ("width_ratio", "width / full"), ("width_vs_floor", "width / floor's"),
            ("effects_found", "effects found"), ("effects_vs_floor", "effects / floor's"),
            ("effects_wrong_sign", "wrong-sign effects"), ("expected_loglik", "E log-lik / record"),
            ("test_loglik", "log pred. density / record"), ("accuracy", "accuracy"), ("rmse", "RMSE")]
    present = [c for c in cols if any(c[0] in r.metrics for r in rep.results)]
    head = "".join(f"<th>{e(t)}</th>" for _, t in present)
    body_rows = []
    for r in rep.results:
        cells = "".join(f"<td>{_fmt(r.metrics[k]) if k in r.metrics else '-'}</td>" for k, _ in present)
        cls = ' class="release"' if r.name == "release" else ""
        secs = f"{r.seconds:.2f}" if r.seconds else "-"
        body_rows.append(f"<tr{cls}><td class=l>{e(r.label)}</td>{cells}<td>{secs}</td><td class=l>{e(r.note)}</td></tr>")
    interval_png = _interval_plot(rep)
    kl_png = _kl_plot(rep)
    floor_html = ""
    if rep.floor is not None:
        from .metrics import Z95, effects

        n_eff = int((effects(rep.full.mean, torch.sqrt(torch.diagonal(rep.full.cov))) != 0).sum())
        fl = rep.floor
        floor_html = (
            "<h2>Against the idealised floor</h2><p class=\"small\">The floor is the most an honest mechanism "
            "could show at this budget: one Gaussian mechanism on the full-data score at the full-data mode "
            f"(noise multiplier {fl.noise_multiplier:.4g} for 80% of the release's epsilon, sensitivity "
            f"{fl.sensitivity:.4g}, the largest per-record score norm), with the data Hessian known for free. "
            "No real mechanism can run it (the mode and the Hessian are private).</p><table>"
            f"<tr><th class=l>full-data effects (95% interval excludes 0)</th><td>{n_eff} of "
            f"{rep.model.param_dim}</td></tr>"
            f"<tr><th class=l>floor: effects found (mean of {fl.draws} noise draws)</th><td>{fl.effects_found:.3g}"
            "</td></tr>"
            f"<tr><th class=l>floor: median width / full-data width</th><td>{fl.width_ratio:.3g}</td></tr>"
            f"<tr><th class=l>floor: coverage of the full-data mean (mean over draws)</th><td>{fl.coverage:.3g}"
            f"</td></tr></table><p class=\"small\">z = {Z95:.3f} for the 95% intervals.</p>")
    meta_rows = "".join(f"<tr><th class=l>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in meta)
    misfit = ""
    lpd = {r.name: r.metrics["test_loglik"] for r in rep.results if "test_loglik" in r.metrics}
    if "prior" in lpd and "full" in lpd and lpd["prior"] > lpd["full"]:
        misfit = ('<p class="warning">The prior scores a higher log predictive density than the full-data '
                  f"posterior ({lpd['prior']:.4g} against {lpd['full']:.4g}): the model does not fit this data "
                  "well (for counts: over-dispersion), so a wider posterior looks better by that column. Compare "
                  "the E log-lik column.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="robots" content="noindex, nofollow">
<title>dpsummary utility report (CURATOR ONLY - do not publish)</title>
<style>{_CSS}</style></head>
<body>
<div class="warning" id="warning">&#9888; {e(WARNING)}</div>
<h1>Utility report: {e(rep.artifact.name)}</h1>
<table class="meta">{meta_rows}</table>
<h2>Metrics against the full-data posterior</h2>
<p class="small">All posteriors are Gaussian ({e(rep.reference)} for the full data; the same inference on
each weighted summary). KL fwd = KL(summary posterior || full-data posterior), the divergence PSVI
minimises; "/ prior" divides by the prior's KL in the same direction (1 = no better than the prior).
Std. mean error = ||Sigma_full^(-1/2) (mu - mu_full)||. Log-likelihoods and accuracy/RMSE are
in-sample, on the curator's mapped records, per record: E log-lik = E_theta log p(y | theta), which
the full-data posterior maximises (up to its own small width); log pred. density = log E_theta
p(y | theta), which rewards a wide posterior when the model does not fit the data (over-dispersed
counts under Poisson regression), so compare fit by E log-lik. RMSE is that of the posterior
predictive mean. Baselines are built NON-privately at the release's size M on the same records:
they show what the privacy costs, and are not publishable either.</p>{misfit}
<div class="wide"><table><tr><th class=l>summary</th>{head}<th>seconds</th><th class=l>note</th></tr>
{''.join(body_rows)}
</table></div>
{floor_html}
<h2>KL divergence</h2>
<img alt="KL bar chart" src="data:image/png;base64,{kl_png}">
<h2>Marginal posteriors</h2>
<img alt="marginal posterior intervals" src="data:image/png;base64,{interval_png}">
<div class="warning">&#9888; {e(WARNING)}</div>
</body></html>
"""


def write_report(rep: ReportData, out: str | Path) -> Path:
    """Write the page atomically; returns its path."""
    from .constructors.base import write_atomic

    out = Path(out)
    write_atomic(out, render_html(rep).encode("utf-8"))
    return out


__all__ = ["DEFAULT_BASELINES", "WARNING", "MethodResult", "ReportData", "build_report", "render_html",
           "write_report"]
