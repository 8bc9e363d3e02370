"""`distilled`: a causal governor whose acceptance model was learnt offline from hindsight (docs/governors.md).

At every iteration with a draft it describes the moment by features a real decode knows then (the lookup's match:
source and n-gram length; the reply's recent depth-wise acceptance, its accepted run, the tokens since the last
miss, the position in the reply, whether the draft is short), predicts with two small logistic models the chance
that each depth of the draft comes true given the one before did, and plays the width with the most expected
tokens per millisecond on the bound cost profile, as goodput does (policies/cost_table.py); whether the last
iteration verified prices the resume. The models' weights are a JSON file written by `python -m sim.train`
(sim/training/), checked against a schema on load and never executed.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, DraftlabError
from sim.core.io import load_json, read_bytes
from sim.core.params import MAX_MAGNITUDE, check_range, param
from sim.core.protocols import PROMPT, Draft, ForwardCosts, LoopChoice

from .base import register
from .cost_table import COST_REFRESH_TOKENS, CostTable, PricedWidth
from .tracker import DraftTracker

SCHEMA = "draftlab-distilled-1"
MODELS = Path(__file__).resolve().parent / "models"  # bundled model files: NAME.json
DEFAULT_MODEL = "edits"
# The features of one decision, in the order of the weight vectors. Every one is known when the decision is made:
# the draft at hand and what landed before it (tests/policies/test_online_governors.py replays traces with changed
# tails).
FEATURES = (
    "bias",
    "output",  # the match's continuation starts in the reply so far (else in the prompt)
    "match_1",  # matched n-gram length 1, 2, 3 (4 or more: all three 0)
    "match_2",
    "match_3",
    "log_match",  # log(matched n-gram length): separates the longer matches a wide ngram_max finds
    "log_run",  # log(1 + landed tokens the tracked drafts got right in a row)
    "log_since_miss",  # log(1 + tokens landed since a tracked draft last missed, or since the reply began)
    "recent_first",  # decayed rate at which depth 1 of the tracked drafts came true, in this reply
    "recent_deep",  # decayed rate at which a depth >= 2 came true given the one before did, in this reply
    "log_position",  # log(1 + tokens emitted so far)
    "short",  # the lookup offered fewer than max_draft tokens (its continuation reached the end of the context)
)
DEEP_EXTRA = ("log_depth",)  # the deep model's one more feature: log(k - 1) for depth k >= 2
RECENT_START = 0.5  # the recent rates before this reply's first settled depth
MAX_FEATURE_WEIGHT = 1e3  # a fitted weight's magnitude; a larger one is a broken file, not a model
# The loop settings a model file's training chose (training/chosen) that the governor plays by default.
LOOP_KEYS = ("max_draft", "ngram_min", "ngram_max")
# The decision settings a model file carries, with their ranges.
DECISION = {
    "margin": (-MAX_MAGNITUDE, MAX_MAGNITUDE),
    "resume_gaps": (0.0, MAX_MAGNITUDE),
    "shrink": (0.0, MAX_MAGNITUDE),
    "decay": (1e-6, 1.0),
}


@dataclass(frozen=True)
class DistilledParams:
    model: str = param(
        DEFAULT_MODEL, "a bundled model (policies/models/NAME.json) or the path of a JSON file sim.train wrote"
    )
    margin: float | None = param(None, "a width > 0 must beat pausing's tokens per ms by this; null: the model's")
    resume_gaps: float | None = param(
        None, "host gaps a verify costs more after an iteration that did not verify; null: the model's"
    )
    shrink: float | None = param(
        None,
        "weight, in observations, of the model's estimate against this reply's counts (0: model only); null: model's",
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must name a bundled model or a JSON file, got ''")
        if self.margin is not None:
            check_range("margin", self.margin, -MAX_MAGNITUDE, MAX_MAGNITUDE)
        if self.resume_gaps is not None:
            check_range("resume_gaps", self.resume_gaps, 0.0, MAX_MAGNITUDE)
        if self.shrink is not None:
            check_range("shrink", self.shrink, 0.0, MAX_MAGNITUDE)


@dataclass(frozen=True)
class Model:
    """A distilled model file, checked: weights in FEATURES order, the decision settings fitted with them."""

    path: str
    sha256: str
    first: tuple[float, ...]  # logit of "depth 1 comes true"
    deep: tuple[float, ...]  # logit of "depth k >= 2 comes true given k - 1 did": FEATURES then log_depth
    recent_weight: float  # weight of the newest settled depth in the recent rates
    margin: float
    resume_gaps: float
    shrink: float  # 0: the model alone; else q = (hits + shrink * p) / (tries + shrink) per depth, this reply's counts
    decay: float  # the reply's counts are multiplied by this before each new observation
    training: dict[str, Any]
    # The loop settings its training chose (training/chosen): what `--policy distilled` plays unless told otherwise.
    loop: dict[str, int] = field(default_factory=dict)


def model_path(model: str) -> Path:
    """A bundled model's file (a plain name), or the path given."""
    if os.sep not in model and "/" not in model and not model.endswith(".json"):
        return MODELS / f"{model}.json"
    return Path(model)


def bundled_models() -> list[str]:
    # NAME.heldout.json beside a model is its evaluation report, not a model
    return sorted(p.stem for p in MODELS.glob("*.json") if "." not in p.stem)


_LOADED: dict[tuple[str, int, int], Model] = {}


def load_model(model: str) -> Model:
    """The checked model `model` names; loaded once per process and file version (every replay makes a governor)."""
    path = model_path(model)
    try:
        stat = path.stat()
    except OSError:
        bundled = ", ".join(bundled_models()) or "none"
        raise ConfigError(
            f"distilled: no model file {path} (model= takes a bundled model, one of {bundled}, or a JSON file "
            "python -m sim.train wrote)"
        ) from None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _LOADED:
        data = read_bytes(path, ConfigError, "distilled model")
        _LOADED[key] = parse_model(data, str(path))
    return _LOADED[key]


def parse_model(data: bytes, where: str) -> Model:
    """A model file's bytes, checked key by key; any mistake is one ConfigError naming the file and the key."""
    raw = load_json(data, where, ConfigError)

    def fail(what: str) -> DraftlabError:
        return ConfigError(f"{where}: {what} (a distilled model file as python -m sim.train writes it)")

    keys = {"schema", "features", "first", "deep", "recent_weight", "decision", "training"}
    if not isinstance(raw, dict) or set(raw) != keys:
        found = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise fail(f"expected exactly the keys {', '.join(sorted(keys))}, got {found}")
    if raw["schema"] != SCHEMA:
        raise fail(f"schema must be {SCHEMA!r}, got {raw['schema']!r}")
    if raw["features"] != list(FEATURES):
        raise fail(f"features must be {list(FEATURES)}")

    def weights(key: str, names: Sequence[str]) -> tuple[float, ...]:
        table = raw[key]
        if not isinstance(table, dict) or sorted(table) != sorted(names):
            raise fail(f"{key} must map exactly {', '.join(names)} to weights")
        out = []
        for name in names:
            value = table[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= MAX_FEATURE_WEIGHT:
                raise fail(f"{key}/{name} must be a number within ±{MAX_FEATURE_WEIGHT:g}, got {value!r}")
            out.append(float(value))
        return tuple(out)

    first = weights("first", FEATURES)
    deep = weights("deep", FEATURES + DEEP_EXTRA)
    recent = raw["recent_weight"]
    if isinstance(recent, bool) or not isinstance(recent, (int, float)) or not 0.0 < recent <= 1.0:
        raise fail(f"recent_weight must be a number in (0, 1], got {recent!r}")
    decision = raw["decision"]
    if not isinstance(decision, dict) or set(decision) != set(DECISION):
        raise fail(f"decision must map exactly {', '.join(DECISION)} to numbers")
    for name, (low, high) in DECISION.items():
        value = decision[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise fail(f"decision/{name} must be a number in {low:g}..{high:g}, got {value!r}")
    if not isinstance(raw["training"], dict):
        raise fail("training must be a mapping (what the model was trained on)")
    return Model(
        path=where,
        sha256=hashlib.sha256(data).hexdigest(),
        first=first,
        deep=deep,
        recent_weight=float(recent),
        margin=float(decision["margin"]),
        resume_gaps=float(decision["resume_gaps"]),
        shrink=float(decision["shrink"]),
        decay=float(decision["decay"]),
        training=raw["training"],
        loop=_chosen_loop(raw["training"], fail),
    )


def _chosen_loop(training: dict[str, Any], fail: Callable[[str], DraftlabError]) -> dict[str, int]:
    """training/chosen's loop settings (LOOP_KEYS), checked; a model file without them plays the loop's defaults."""
    chosen = training.get("chosen", {})
    if not isinstance(chosen, dict):
        raise fail("training/chosen must be a mapping (the settings its training chose)")
    loop = {key: chosen[key] for key in LOOP_KEYS if key in chosen}
    for key, value in loop.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise fail(f"training/chosen/{key} must be an integer >= 1, got {value!r}")
    return loop


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= -700.0 else 0.0


@register("distilled")
class Distilled(PricedWidth[DistilledParams]):
    Params = DistilledParams

    def __init__(self, params: DistilledParams, max_draft: int, model: Model | None = None):
        super().__init__(params, max_draft)
        self.model = model if model is not None else load_model(params.model)
        m = self.model
        self.margin = m.margin if params.margin is None else params.margin
        self.resume_gaps = m.resume_gaps if params.resume_gaps is None else params.resume_gaps
        self.first_w = m.first
        self.deep_w = m.deep[: len(FEATURES)]
        # The depth term of the deep model's logit, per depth k = 2..max_draft: log(k - 1) times its weight.
        self.depth_term = [m.deep[-1] * math.log(k - 1) for k in range(2, max_draft + 1)]
        self.table: CostTable | None = None
        self.tracker = DraftTracker()
        self.recent_first = self.recent_deep = RECENT_START
        self.reply_start = -1  # context length before the first emitted token, known at the first observe
        self.last_miss = -1  # context length just after the last rejected depth landed
        self.width = 0
        self.pausing = False
        self.resuming = True  # the last iteration did not verify: a verify now pays the resume price
        self.shrink = m.shrink if params.shrink is None else params.shrink
        # This reply's decayed counts per depth k: tries of "depth k came true given k - 1 did", and hits.
        self.hits = [0.0] * max_draft
        self.tries = [0.0] * max_draft
        self.features: list[float] = [0.0] * len(FEATURES)  # the last decision's, for records and training

    @classmethod
    def loop_choice(cls, params: DistilledParams) -> LoopChoice | None:
        """The loop settings the model was trained at: its features and thresholds were fitted on rows replayed at
        them, so they, not the loop's defaults, are what the model plays unless the user sets others."""
        model = load_model(params.model)
        if not model.loop:
            return None
        return LoopChoice(dict(model.loop), f"model {params.model} (the loop settings its training chose)")

    def bind(self, costs: ForwardCosts) -> None:
        self.table = CostTable(costs, self.max_draft, self.resume_gaps)

    def observe(self, context: Sequence[int], draft: Draft) -> None:
        n_context = len(context)
        if self.reply_start < 0:
            self.reply_start = self.last_miss = n_context - 1  # prefill has emitted the reply's first token
        tracker = self.tracker
        if tracker.tokens and n_context > tracker.start + tracker.depth:  # tokens landed where it predicted
            self._learn(*tracker.advance(context))
        tokens = draft.tokens
        if not tokens:
            self.no_draft(tracker)
            return
        if not tracker.tokens:
            tracker.follow(n_context, tokens, 0)
        match = draft.match_length
        x = self.features
        x[0] = 1.0
        x[1] = float(draft.source != PROMPT)
        x[2] = float(match <= 1)
        x[3] = float(match == 2)
        x[4] = float(match == 3)
        x[5] = math.log(match) if match > 1 else 0.0
        x[6] = math.log1p(tracker.run)
        x[7] = math.log1p(n_context - self.last_miss)
        x[8] = self.recent_first
        x[9] = self.recent_deep
        x[10] = math.log1p(n_context - self.reply_start)
        x[11] = float(len(tokens) < self.max_draft)
        table = self.table
        assert table is not None, "distilled reads the cost profile: bind() it first"
        if n_context - table.at >= COST_REFRESH_TOKENS or n_context < table.at:
            table.at_context(n_context)
        ms = table.resume if self.resuming else table.ms
        first = sum(w * v for w, v in zip(self.first_w, x, strict=True))
        deep = sum(w * v for w, v in zip(self.deep_w, x, strict=True))
        # best_width (policies/cost_table.py) in one pass, as goodput inlines it: pausing's rate is the bar.
        best, best_rate = 0, (1.0 + self.margin) / ms[0]
        shrink = self.shrink
        hits, tries = self.hits, self.tries
        s = _sigmoid(first)
        if shrink:  # the model's estimate, moved by this reply's own counts (goodput's shrinkage, section 9)
            s = (hits[0] + shrink * s) / (tries[0] + shrink)
        expected = 1.0 + s
        rate = expected / ms[1]
        if rate > best_rate:
            best, best_rate = 1, rate
        depth_term = self.depth_term
        for depth in range(1, len(tokens)):
            q = _sigmoid(deep + depth_term[depth - 1])
            if shrink:
                q = (hits[depth] + shrink * q) / (tries[depth] + shrink)
            s *= q
            expected += s
            rate = expected / ms[depth + 1]
            if rate > best_rate:
                best, best_rate = depth + 1, rate
        self.width = best
        self.pausing = self.resuming = best == 0

    def _learn(self, first: int, confirmed: int, rejected: bool) -> None:
        """The recent rates and the last miss, from depths first+1.. of the tracked draft that just landed."""
        a = self.model.recent_weight
        settled = confirmed + rejected
        g = self.model.decay
        for depth in range(first, first + settled):
            hit = float(depth < first + confirmed)
            self.hits[depth] = g * self.hits[depth] + hit
            self.tries[depth] = g * self.tries[depth] + 1.0
            if depth == 0:
                self.recent_first += a * (hit - self.recent_first)
            else:
                self.recent_deep += a * (hit - self.recent_deep)
        if rejected:
            # tracker.depth depths came true; the miss is the token after them, at context position start + depth
            self.last_miss = self.tracker.start + self.tracker.depth + 1

    def survival(self, depths: int) -> list[float]:
        """s_k = P(depths 1..k of the draft at hand all come true) for k = 1..depths, from the last features."""
        x = self.features
        first = sum(w * v for w, v in zip(self.first_w, x, strict=True))
        deep = sum(w * v for w, v in zip(self.deep_w, x, strict=True))
        out = []
        s = 1.0
        shrink, hits, tries = self.shrink, self.hits, self.tries
        for depth in range(depths):
            q = _sigmoid(first if depth == 0 else deep + self.depth_term[depth - 1])
            if shrink:
                q = (hits[depth] + shrink * q) / (tries[depth] + shrink)
            s *= q
            out.append(s)
        return out

    def state(self) -> dict[str, Any]:
        return {"width": self.width, "features": dict(zip(FEATURES, self.features, strict=True))}
