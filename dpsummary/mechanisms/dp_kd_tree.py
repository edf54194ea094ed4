"""``dp-kd-tree``: the Gaussian mixture's private release (``--model gmm|dpgmm``).

L + 1 Gaussian mechanisms, one per depth of a kd-tree over the public box of the numeric
columns, on the counts of the nodes released at that depth (each record lies in one node per
depth: L2 sensitivity 1; :mod:`dpsummary.private.mixture`, the privacy boundary). Which nodes are
released next is decided on the noisy counts only. Weighted CAVI on the released pseudo-points
with a public prior is post-processing (docs/MIXTURES.md, "The private release").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..errors import ReleaseError
from .base import (
    CheckpointFn,
    Mechanism,
    MechanismOutput,
    MechanismPlan,
    ProgressFn,
    check_released_count,
    quality_noise,
    quality_parts,
    refusal_kind,
    selection_slack,
    stage_noise,
)

if TYPE_CHECKING:
    from ..plan import PublicPlan, Released, ReleaseRequest
    from ..selftest.config import SelftestScenario

#: Public defaults and caps of a mixture release (docs/MIXTURES.md, "The private release").
MIXTURE_DEFAULT_COMPONENTS = 10
MIXTURE_MAX_COMPONENTS = 50
#: The mixture's space: each numeric column's public bounds map onto [-BOUND, BOUND]
#: (``z = BOUND (x - centre) / half_range``), the noisy kd-tree's public box
#: (:data:`dpsummary.mixtures.kdtree.DEFAULT_BOUND`).
MIXTURE_BOUND = 4.0
#: Public cap on the released pseudo-points weighted CAVI is run on (post-processing cost only;
#: a larger release keeps the points of the leaves with the largest noisy counts for the fit,
#: all of them stay in the artifact).
MIXTURE_FIT_MAX_POINTS = 20000
#: The public prior of the published fit (the benchmarks' prior, docs/MIXTURES.md): component
#: covariance scale 0.01 of the unit box, mean 0, one degree of freedom more than D - 1.
MIXTURE_PRIOR_COVARIANCE = 0.01
#: The registry names a mixture release serves.
MIXTURE_MODELS = frozenset({"gmm", "dpgmm"})


def mixture_columns(schema: Any) -> list[str]:
    """The columns a mixture release models: every numeric column (with its public bounds; a
    target included: a mixture models the columns jointly). Categorical columns are not
    Gaussian and are left out."""
    return [col.name for col in schema.columns if col.kind == "numeric"]


def mixture_transform(req: ReleaseRequest, schema: Any) -> Any:
    """The public transform of a mixture release: the numeric columns only, no target, each
    column's public bounds mapped onto the kd-tree's box ``[-MIXTURE_BOUND, MIXTURE_BOUND]``
    (``z = MIXTURE_BOUND (x - centre) / half_range``; values outside the bounds are clipped, the
    total per-record rule of :class:`~dpsummary.data.Transform`). Pseudo-points live in this
    space. A numeric column without public bounds is a one-line refusal (:class:`ReleaseError`;
    the caller re-raises it with its own kind)."""
    import dataclasses

    from ..data import DataError, Schema, Transform

    columns = [c.model_copy(update={"positive": None}) for c in schema.columns if c.kind == "numeric"]
    if not columns:
        raise ReleaseError(f"--model {req.model} needs at least one numeric column; the schema has none",
                           fix="choose another --model, or declare a numeric column in the policy's schema")
    try:
        base = Transform.from_schema(Schema(columns=columns, target=None))
    except DataError as exc:
        raise ReleaseError(f"--model {req.model}: {exc.problem}",
                           fix=exc.fix or "give every numeric column lower and upper in the policy's schema") from None
    return dataclasses.replace(base, scales={k: v / MIXTURE_BOUND for k, v in base.scales.items()})


def mixture_components(fit: Any, transform: Any, columns: list[str]) -> dict[str, Any]:
    """The fitted mixture in the CSV's units (components above 0.1% of the mass)."""
    import numpy as np

    centres = np.array([transform.centres[c] for c in columns])
    unit = np.array([transform.scales[c] for c in columns])
    weights = fit.expected_weights()
    keep = np.flatnonzero(weights > 1e-3)
    means = fit.means[keep] * unit + centres
    covs = fit.covariances()[keep] * np.outer(unit, unit)
    return {"columns": columns, "weights": weights[keep].tolist(), "means": means.tolist(),
            "covariances": covs.tolist()}


class DpKdTree(Mechanism):
    """The noisy adaptive kd-tree for ``--model gmm|dpgmm`` (see the module docstring)."""

    name: ClassVar[str] = "dp-kd-tree"
    models: ClassVar[frozenset[str]] = MIXTURE_MODELS
    options: ClassVar[tuple[str, ...]] = ("components",)
    #: A mixture models the numeric columns jointly: no column is a target.
    uses_target: ClassVar[bool] = False
    sampling: ClassVar[str] = "none (every record)"

    def check_public(self, req: ReleaseRequest, schema: Any | None) -> None:
        if req.target is not None:
            raise ReleaseError(f"--target has no meaning for --model {req.model} (a mixture models the numeric "
                               "columns jointly)", fix="leave it out")
        if req.engine != "local":
            raise ReleaseError(f"--model {req.model} runs on the local engine only", fix="use --engine local")
        k = req.components if req.components is not None else MIXTURE_DEFAULT_COMPONENTS
        if not 1 <= k <= MIXTURE_MAX_COMPONENTS:
            raise ReleaseError(f"--components must lie in 1..{MIXTURE_MAX_COMPONENTS}",
                               fix=f"pass --components between 1 and {MIXTURE_MAX_COMPONENTS}, or leave it out")
        if schema is not None:
            if not mixture_columns(schema):
                raise ReleaseError(f"--model {req.model} needs at least one numeric column with public bounds in "
                                   "the schema", fix="declare lower and upper, or choose another --model")
            mixture_transform(req, schema)

    def plan(self, public: PublicPlan, released: Released) -> MechanismPlan:
        """The numeric columns (public bounds mapped onto the kd-tree's box), the tree's public
        design (depth min(6 D, 36), split at 3 sigma, keep at 2 sigma;
        :func:`dpsummary.mixtures.kdtree.default_max_depth`) and its noise multiplier, calibrated
        with the accountant of record so that everything composes to the release's epsilon."""
        from dp_accounting import dp_event as dpe

        from .. import accounting as acc
        from ..mixtures import kdtree
        from ..models.gmm import mixture_model

        req, pol, schema = public.req, public.policy, released.schema
        refuse = refusal_kind(public)
        assert req.model is not None
        pol.check_model(req.model)
        check_released_count(public, released, refuse)
        columns = mixture_columns(schema)
        if not columns:
            raise refuse(f"--model {req.model} needs at least one numeric column; the schema has none",
                         fix="choose another --model")
        try:
            transform = mixture_transform(req, schema)
        except ReleaseError as exc:
            raise refuse(exc.problem, fix=exc.fix) from None
        k = req.components if req.components is not None else MIXTURE_DEFAULT_COMPONENTS
        process: Literal["dirichlet_process", "dirichlet_distribution"] = (
            "dirichlet_process" if req.model == "dpgmm" else "dirichlet_distribution")
        model = mixture_model(len(columns), n_components=k, process=process)
        quality_sigma, before = quality_noise(public, public.split)
        depth = kdtree.default_max_depth(len(columns))
        sigma = acc.calibrate_noise_multiplier(target_epsilon=req.epsilon - selection_slack(public),
                                               delta=public.delta, sample_rate=1.0, steps=depth + 1,
                                               prior_events=before, accountant=public.accountant)
        tree = kdtree.TreePlan(dim=len(columns), bound=MIXTURE_BOUND, max_depth=depth, noise_multiplier=sigma)
        event = dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(sigma), depth + 1)
        settings = {"columns": columns, "tree": tree, "process": process, "components": k}
        return MechanismPlan(self.name, model, transform, sigma, 1.0, depth + 1, quality_sigma,
                             (*quality_parts(quality_sigma), ("optimisation", event)), settings)

    def run(self, public: PublicPlan, plan: MechanismPlan, records: Any, *, record_count: float,
            progress: ProgressFn | None = None, checkpoint: CheckpointFn | None = None) -> MechanismOutput:
        """The noisy kd-tree (:func:`dpsummary.mixtures.dp_summary.release_mixture_summary`) on the
        records (already in the tree's box: the mixture transform maps the bounds onto it), then
        weighted CAVI on the released pseudo-points with a public prior (post-processing)."""
        import secrets

        import numpy as np
        import torch

        from ..constructors.base import Summary
        from ..mixtures.dp_summary import release_mixture_summary
        from ..mixtures.vi import MixturePrior, fit_cavi

        mark = checkpoint or (lambda _name: None)
        req = public.req
        notes: list[str] = []
        columns = plan.settings["columns"]
        mark("initialised")
        rel = release_mixture_summary(records, plan=plan.settings["tree"])
        if progress is not None:
            progress(plan.steps, plan.steps)
        mark("optimised")
        d, k = len(columns), plan.settings["components"]
        components: dict[str, Any] | None = None
        if rel.weights.shape[0]:
            # Weighted CAVI on the released pseudo-points (post-processing): public prior, public or
            # OS-random start. A very large release is fitted on its heaviest leaves (a public cap on
            # the cost; the artifact keeps every point).
            seed = req.seed if req.seed is not None else secrets.randbits(63)
            order = np.argsort(-rel.weights, kind="stable")[:MIXTURE_FIT_MAX_POINTS]
            prior = MixturePrior(process=plan.settings["process"], n_components=k, weight_concentration=1.0 / k,
                                 mean_precision=1.0, mean=np.zeros(d), degrees_of_freedom=float(d),
                                 covariance=MIXTURE_PRIOR_COVARIANCE * np.eye(d))
            fit = fit_cavi(rel.points[order], rel.weights[order], prior, np.random.default_rng(seed)).posterior
            components = mixture_components(fit, plan.transform, columns)
            notes.append(f"mixture fitted by weighted CAVI on the released pseudo-points "
                         f"({len(components['weights'])} components above 0.1% of the mass)")
        else:
            notes.append("every kd-tree leaf fell below the public keep threshold: the release holds no pseudo-point "
                         "(too few records for this epsilon)")
        summary = Summary(torch.from_numpy(np.ascontiguousarray(rel.points)), torch.from_numpy(rel.weights.copy()),
                          plan.model, self.name, plan.transform.to_dict(),
                          {"space": ("the transform's model space: z = (x - centre) / scale per numeric column, "
                                     f"the public bounds mapped onto [-{MIXTURE_BOUND:g}, {MIXTURE_BOUND:g}]"),
                           "tree": {"leaves": rel.notes.get("leaves"),
                                    "released_per_depth": rel.notes.get("released_per_depth")},
                           "mixture": components})
        return MechanismOutput(summary, notes)

    def claim(self, public: PublicPlan, plan: MechanismPlan, output: MechanismOutput) -> dict[str, Any]:
        tree = plan.settings["tree"]
        return {
            "name": self.name,
            "description": ("noisy adaptive kd-tree (a Gaussian-noise, fixed-depth relative of PrivTree, Zhang, "
                            "Xiao and Xie 2016): the public box of the numeric columns (public bounds mapped onto "
                            f"[-{MIXTURE_BOUND:g}, {MIXTURE_BOUND:g}]) is split at midpoints cycling over the "
                            "columns; at each depth the counts of the released nodes get Gaussian noise of sd sigma "
                            "once (each record lies in one node per depth: L2 sensitivity 1), a node is split iff "
                            "its noisy count is at least split_threshold x sigma, kept leaves (noisy count at least "
                            "keep_threshold x sigma) become 2D weighted pseudo-points with the cell's mean and "
                            "covariance; weighted CAVI on them is post-processing"),
            "noise_multiplier": plan.noise_multiplier,
            "levels": tree.max_depth + 1,
            "max_depth": tree.max_depth,
            "split_threshold": tree.split_threshold,
            "keep_threshold": tree.keep_threshold,
            "bound": tree.bound,
            "columns": plan.settings["columns"],
            "model": {"name": plan.model.name, "components": plan.settings["components"],
                      "process": plan.settings["process"],
                      "prior": {"weight_concentration": 1.0 / plan.settings["components"], "mean_precision": 1.0,
                                "mean": 0.0, "degrees_of_freedom": len(plan.settings["columns"]),
                                "covariance": f"{MIXTURE_PRIOR_COVARIANCE:g} I (in the box's units)"}},
            "noise": "OpenDP discrete Gaussian from OS entropy",
            **stage_noise(public, plan),
        }

    def selftest_scenarios(self) -> tuple[SelftestScenario, ...]:
        """``--mixture``: noise scale, accountant reproduction, coupled neighbour replay
        (:func:`dpsummary.selftest.mixture.mixture_checks`)."""
        from ..selftest.config import SelftestScenario
        from ..selftest.mixture import mixture_checks

        return (SelftestScenario("mixture", self.name, "mixture", lambda cfg: cfg.mixture,
                                 lambda cfg, ctx, progress: mixture_checks(inject=cfg.inject, noise_path=cfg.noise)),)
