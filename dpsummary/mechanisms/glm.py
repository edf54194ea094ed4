"""What the two GLM mechanisms (``noise-aware-newton``, ``dp-psvi``) share: the public
model/schema check and the start of their stage-2 plan (model, public transform, budget split).
They serve every model no family mechanism claims (``models`` empty)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ReleaseError
from .base import Mechanism, check_released_count, refusal_kind
from .dp_psvi_setup import DP_INITIALISATION_MODELS

if TYPE_CHECKING:
    from ..plan import PublicPlan, Released, ReleaseRequest


def check_model_for_schema(model_name: str | None, schema: Any) -> None:
    """With a public schema the model/target match is a public fact: refuse before reserving."""
    from .. import data as dmod
    from ..models import get_model_class

    if model_name is None:
        return
    kind = dmod.target_kind(schema)
    if model_name == "logistic" and kind != "binary":
        raise ReleaseError(f"logistic regression needs a binary target; the schema's target is {kind}",
                           fix="choose --model for it or fix the schema (`dpsummary policy init DATA` writes a "
                           "schema skeleton)")
    n_features = dmod.Transform.from_schema(schema).num_features
    point_dim = n_features + (0 if schema.target is None else 1)
    if get_model_class(model_name)(n_features).point_dim != point_dim:
        raise ReleaseError(f"model {model_name!r} does not match the schema's target ({kind})",
                           fix="choose another --model")


def glm_model(public: PublicPlan, released: Released) -> tuple[str, Any, Any]:
    """``(model name, public transform, model)`` from the released schema: ``--model`` or the
    target kind's default; the policy's model list, min_records and n_max, and the model/target
    match are checked here (:func:`~dpsummary.mechanisms.base.refusal_kind`)."""
    from .. import data as dmod
    from ..models import get_model_class

    req, pol, schema = public.req, public.policy, released.schema
    refuse = refusal_kind(public)
    kind = dmod.target_kind(schema)
    model_name = req.model or dmod.default_model_name(kind)
    pol.check_model(model_name)
    check_released_count(public, released, refuse)
    transform = dmod.Transform.from_schema(schema)
    model = get_model_class(model_name)(transform.num_features)
    if model.point_dim != transform.point_dim:
        raise refuse(f"model {model_name!r} does not match the data's target ({kind})", fix="choose another --model")
    if model_name == "logistic" and kind != "binary":
        raise refuse(f"logistic regression needs a binary target; the target is {kind}", fix="choose another --model")
    return model_name, transform, model


def glm_split(public: PublicPlan, initialisation: bool) -> dict[str, float]:
    """The budget split stage 2 uses: stage 0's, without the initialisation share when this model
    has no DP initialisation (known only now: the model follows the schema; the share goes to the
    optimisation)."""
    split = public.split
    if not initialisation and split["initialisation"] > 0:
        nonzero = {k for k, v in split.items() if v > 0}
        split = public.policy.budget_split.normalised(count="count" in nonzero,
                                                      preprocessing="preprocessing" in nonzero,
                                                      initialisation=False)
    return split


class GlmMechanism(Mechanism):
    """What both GLM mechanisms declare the same way: they serve every model no family mechanism
    claims, read the target, check the model against a public schema, and keep the same stage-0
    parts (a model that could use DP initialisation keeps its share, whatever the mechanism, so
    stage 0's budget split does not depend on the mechanism; noise-aware-newton's plan hands it
    to the optimisation)."""

    models: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[tuple[str, ...]] = ()
    uses_target: ClassVar[bool] = True

    def check_public(self, req: ReleaseRequest, schema: Any | None) -> None:
        if schema is not None:
            check_model_for_schema(req.model, schema)

    def budget_parts(self, req: ReleaseRequest) -> frozenset[str]:
        dp_init = req.model is None or req.model in DP_INITIALISATION_MODELS
        return frozenset({"initialisation"}) if dp_init else frozenset()
