"""``dp-bb-psvi``: the Bayesian neural network's private release (``--model bnn``).

T steps of the Poisson-subsampled Gaussian mechanism on each record's statistic
``[log p(x|theta_k), grad_theta log p(x|theta_k)]_k`` at public draws, divided by C and clipped
to norm 1 (:mod:`dpsummary.private.bnn`, the privacy boundary); the coreset's Adam step on the
surrogate outer gradient is post-processing. The start is public (no initialisation share).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ReleaseError
from .base import (
    CheckpointFn,
    Mechanism,
    MechanismOutput,
    MechanismPlan,
    ProgressFn,
    check_released_count,
    default_sample_rate,
    nonprivate_generator,
    quality_noise,
    quality_parts,
    refusal_kind,
    selection_slack,
    stage_noise,
)

if TYPE_CHECKING:
    from ..plan import PublicPlan, Released, ReleaseRequest
    from ..selftest.config import SelftestScenario

#: Target kind -> BNN likelihood (categorical targets with more than two classes are not yet
#: encodable by the public transform; count targets have no BNN likelihood here).
BNN_LIKELIHOODS = {"binary": "bernoulli", "real": "gaussian"}
#: Public caps on the network (options are public; the caps bound the statistic's dimension).
BNN_MAX_LAYERS = 4
BNN_MAX_WIDTH = 512


def bnn_widths(req: ReleaseRequest) -> tuple[int, ...]:
    """``--bnn-widths``, else :data:`dpsummary.blackbox.dp_bb_psvi.DEFAULT_WIDTHS`."""
    from ..blackbox import dp_bb_psvi as bb

    return tuple(req.bnn_widths) if req.bnn_widths is not None else bb.DEFAULT_WIDTHS


class DpBbPsvi(Mechanism):
    """Differentially private black-box PSVI for ``--model bnn`` (see the module docstring)."""

    name: ClassVar[str] = "dp-bb-psvi"
    models: ClassVar[frozenset[str]] = frozenset({"bnn"})
    options: ClassVar[tuple[str, ...]] = ("bnn_widths",)
    uses_target: ClassVar[bool] = True
    sampling: ClassVar[str] = "poisson"

    def check_public(self, req: ReleaseRequest, schema: Any | None) -> None:
        if req.engine != "local":
            raise ReleaseError("--model bnn runs on the local engine only", fix="use --engine local")
        widths = bnn_widths(req)
        if not (1 <= len(widths) <= BNN_MAX_LAYERS and all(1 <= int(w) <= BNN_MAX_WIDTH for w in widths)):
            raise ReleaseError(f"--bnn-widths must be 1 to {BNN_MAX_LAYERS} hidden widths, each in 1..{BNN_MAX_WIDTH}",
                               fix="pass e.g. --bnn-widths 32,16")
        if schema is not None:
            from .. import data as dmod

            kind = dmod.target_kind(schema)
            if kind not in BNN_LIKELIHOODS:
                raise ReleaseError(f"--model bnn needs a binary or real target; the schema's target is {kind}",
                                   fix="choose another --model or fix the schema (`dpsummary policy init DATA` "
                                   "writes a schema skeleton)")

    def plan(self, public: PublicPlan, released: Released) -> MechanismPlan:
        """The network (public widths, ReLU, N(0, 1) prior, likelihood from the target kind), the
        public transform, q (default 200 / released count), the quality counts' noise, and the
        noise multiplier of T Poisson-subsampled Gaussian steps calibrated so that everything
        composes to the release's epsilon."""
        from .. import accounting as acc
        from .. import data as dmod
        from ..blackbox import dp_bb_psvi as bb
        from ..models.bnn import BNN

        req, pol, schema = public.req, public.policy, released.schema
        refuse = refusal_kind(public)
        kind = dmod.target_kind(schema)
        pol.check_model("bnn")
        check_released_count(public, released, refuse)
        if kind not in BNN_LIKELIHOODS:
            raise refuse(f"--model bnn needs a binary or real target; the target is {kind}", fix="choose another --model")
        transform = dmod.Transform.from_schema(schema)
        model = BNN(transform.num_features, widths=bnn_widths(req), likelihood=BNN_LIKELIHOODS[kind],
                    activation="relu")
        if model.point_dim != transform.point_dim:
            raise refuse("model 'bnn' does not match the data's target", fix="choose another --model")
        q = default_sample_rate(req, released)
        quality_sigma, before = quality_noise(public, public.split)  # no initialisation share
        sigma = acc.calibrate_noise_multiplier(
            target_epsilon=req.epsilon - selection_slack(public), delta=public.delta, sample_rate=q,
            steps=req.steps, prior_events=before, accountant=public.accountant,
        )
        settings = {
            "clip_norm": bb.DEFAULT_CLIP_NORM, "outer_samples": bb.DEFAULT_OUTER_SAMPLES,
            "inner_steps": bb.DEFAULT_INNER_STEPS, "warmup_steps": bb.DEFAULT_WARMUP_STEPS,
            "points_lr": bb.DEFAULT_POINTS_LR, "weights_lr": bb.DEFAULT_WEIGHTS_LR,
        }
        parts = (*quality_parts(quality_sigma),
                 ("optimisation", acc.subsampled_gaussian_event(sigma, q, req.steps)))
        return MechanismPlan(self.name, model, transform, sigma, q, req.steps, quality_sigma, parts, settings)

    def run(self, public: PublicPlan, plan: MechanismPlan, records: Any, *, record_count: float,
            progress: ProgressFn | None = None, checkpoint: CheckpointFn | None = None) -> MechanismOutput:
        """DP BB-PSVI (:func:`dpsummary.blackbox.dp_bb_psvi.fit_private`) on the encoded records from the
        public start."""
        from ..blackbox import dp_bb_psvi as bb
        from ..blackbox.objective import InnerConfig
        from ..constructors.base import Summary

        mark = checkpoint or (lambda _name: None)
        req = public.req
        nonpriv = nonprivate_generator(req.seed)
        model, st = plan.model, plan.settings
        initial = bb.public_init_from_schema(model, req.size, nonpriv, plan.transform.sample_public_features)
        notes = ["initial pseudopoints from public information only (features uniform over the policy's "
                 "bounds and categories, labels uniform)"]
        mark("initialised")
        fit = bb.fit_private(
            records, model, size=req.size, steps=plan.steps, sample_rate=plan.sample_rate,
            noise_multiplier=plan.noise_multiplier, clip_norm=st["clip_norm"], record_count=record_count,
            initial_points=initial, generator=nonpriv, inner=InnerConfig(steps=st["inner_steps"]),
            outer_samples=st["outer_samples"], warmup_steps=st["warmup_steps"], points_lr=st["points_lr"],
            weights_lr=st["weights_lr"], progress=progress,
        )
        mark("optimised")
        summary = Summary(fit.points, fit.weights, model, bb.MECHANISM, plan.transform.to_dict(),
                          {"variational": {"family": "mean-field Gaussian, sd = softplus(rho)",
                                           "mu": fit.mu.tolist(), "rho": fit.rho.tolist()}})
        return MechanismOutput(summary, notes)

    def claim(self, public: PublicPlan, plan: MechanismPlan, output: MechanismOutput) -> dict[str, Any]:
        from ..models.bnn import BNN

        model = plan.model
        assert isinstance(model, BNN)
        st = plan.settings
        return {
            "name": self.name,
            "description": ("differentially private black-box PSVI (Manousakas, Ritter, Karaletsos 2022, "
                            "extended): at each of T steps every record is Poisson-sampled with rate q, its "
                            "statistic [log p(x|theta_k), grad_theta log p(x|theta_k)]_{k=1..K} at K public "
                            "draws of the coreset's variational posterior is divided by C and clipped to L2 norm 1, "
                            "the exact fixed-point sum gets Gaussian noise of sd sigma once and is multiplied "
                            "by C; the coreset takes an Adam step on the surrogate outer gradient "
                            "(post-processing)"),
            "noise_multiplier": plan.noise_multiplier,
            "sample_rate": plan.sample_rate,
            "steps": plan.steps,
            "clip_norm": st["clip_norm"],
            "statistic_dimension": st["outer_samples"] * (model.param_dim + 1),
            "outer_samples": st["outer_samples"],
            "inner": {"steps": st["inner_steps"], "warmup_steps": st["warmup_steps"]},
            "learning_rates": {"points": st["points_lr"], "weights": st["weights_lr"]},
            "network": {"widths": list(model.widths), "activation": model.activation,
                        "likelihood": model.likelihood,
                        "prior": {"family": "normal", "mean": 0.0, "scale": model.prior_scale}},
            "initialisation": ("public: features uniform over the policy's bounds and categories, labels uniform "
                               "(Bernoulli) or 0 (Gaussian); no privacy cost"),
            "noise": "OpenDP discrete Gaussian from OS entropy",
            **stage_noise(public, plan),
        }

    def selftest_scenarios(self) -> tuple[SelftestScenario, ...]:
        """``--bnn``: noise scale, accountant reproduction, gray-box replay
        (:func:`dpsummary.selftest.bnn.bnn_checks`)."""
        from ..selftest.bnn import bnn_checks
        from ..selftest.config import SelftestScenario

        return (SelftestScenario("bnn", self.name, "bnn", lambda cfg: cfg.bnn,
                                 lambda cfg, ctx, progress: bnn_checks(inject=cfg.inject, progress=progress)),)
