"""Serving cost profiles: what one batched engine step costs, from its composition (docs/serving-profiles.md).

A single-request profile (`sim.engine.costs`) prices a forward by its width and context. A serving engine runs
many requests per step, so a serving profile prices a whole step from its `StepShape`:

    device(step) = forward(N) + kv_ms_per_token * kv_tokens + attention_ms_per_pair * attention_pairs
    host(step)   = step_ms + sequence_ms * sequences + draft_ms * drafting

N is the number of tokens scheduled in the step; forward(N) is a table on a grid of N, piecewise linear between
grid points. One format serves three sources: a fit to timed vLLM steps (`fit_serving_profile`), a roofline from a
model's shape and a GPU's public specifications (`roofline_profile`), and a table a user writes by hand.
`ReplayStepCosts` prices one-request steps with a single-request profile, so that the serving simulator can be
held equal to replay.
"""

from sim.engine.serving_costs.files import (
    bundled_serving_profiles,
    bundled_serving_summaries,
    dump_serving_profile,
    read_serving_profile,
    resolve_serving,
    serving_profile_from_dict,
    serving_profile_from_text,
)
from sim.engine.serving_costs.fit import fit_serving_profile
from sim.engine.serving_costs.profile import (
    BUNDLED,
    FORMAT,
    KEYS,
    FrontendCosts,
    ReplayStepCosts,
    ServingProfile,
    StepShape,
    step_shape,
)
from sim.engine.serving_costs.roofline import (
    DEFAULT_OVERHEAD,
    ROOFLINE_MAX_TOKENS,
    GpuSpec,
    ModelShape,
    Overhead,
    Roofline,
    decoder_params,
    roofline_grid,
    roofline_profile,
    roofline_terms,
)

__all__ = [
    "BUNDLED",
    "DEFAULT_OVERHEAD",
    "FORMAT",
    "KEYS",
    "ROOFLINE_MAX_TOKENS",
    "FrontendCosts",
    "GpuSpec",
    "ModelShape",
    "Overhead",
    "ReplayStepCosts",
    "Roofline",
    "ServingProfile",
    "StepShape",
    "bundled_serving_profiles",
    "bundled_serving_summaries",
    "decoder_params",
    "dump_serving_profile",
    "fit_serving_profile",
    "read_serving_profile",
    "resolve_serving",
    "roofline_grid",
    "roofline_profile",
    "roofline_terms",
    "serving_profile_from_dict",
    "serving_profile_from_text",
    "step_shape",
]
