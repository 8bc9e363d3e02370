"""What a serving study asks of the engine it serves on: one registered class per serving scheduler.

A serving study (sim/tuning/specs/serving.py) names an engine (`engine:`, by default the one sim.serve models); the
engine's serving scheduler picks its class here. The class reads what only that engine has (the searched policy
family, the scheduler's keys, a drafter), serves one configuration at one load level, and writes what runs the
best configuration on that engine (best.yaml's keys and the report's "Run it on an engine" section). The trial loop,
the objectives, the holdout seeds and the rest of the report are the same for every engine.

  vllm-v1          vLLM's V1 scheduler: a speculation policy (policies/speculation.py: static, dsd_tiers, ...) over
                   vLLM's drafter keys; best.yaml carries `speculative_config`, the `vllm serve` line and
                   TensorRT-LLM's settings.
  llamacpp-slots   llama-server's slots: llama-server's own flags (policy llamacpp, policies/llamacpp.py: --spec-type,
                   each type's sizes, -np, -c); best.yaml carries `llama_server_flags` and the `llama-server` line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from typing import Any, ClassVar, Protocol

from policies.llamacpp import NONE as NO_SPEC_TYPE
from policies.llamacpp import LlamaServerParams, from_flags
from policies.speculation import REGISTRY as SPECULATION
from policies.speculation import make_speculation
from policies.vllm import SCHEDULE_KEY, VllmParams, from_speculative_config, parse_schedule
from sim.core.errors import ConfigError
from sim.core.params import build_params, fields_of
from sim.core.registry import Registry
from sim.engine.serving import ProfileCosts, SchedulerParams
from sim.engine.serving.llamacpp_slots import SlotsParams
from sim.rows.exports import export_for
from sim.rows.llamacpp_serving import SERVING_KEYS, run_llamacpp_serving, slots_params
from sim.rows.serving import ServingRow, Slo, Variant, run_serving
from sim.tuning.specs.loads import Load
from sim.tuning.specs.reader import Reader


class ServingSpec(Protocol):
    """What an engine's part reads of a serving study (sim/tuning/specs/serving.py's ServingSpec, which holds one
    of these classes: this view keeps the two modules from importing each other)."""

    @property
    def engine(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def fixed(self) -> dict[str, Any]: ...
    @property
    def baseline(self) -> Variant: ...
    @property
    def drafter(self) -> VllmParams | None: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def scheduler_keys(self) -> dict[str, Any]: ...
    @property
    def slo(self) -> Slo: ...
    @property
    def load(self) -> Load: ...
    @property
    def drafter_keys(self) -> dict[str, Any]: ...


DRIVER = "recurrence"  # the plain-loop driver: the same steps as the simpy model, to the last bit, and faster
# vLLM's documented n-gram example, as python -m sim.serve's default drafter: matching 2- to 3-grams.
DEFAULT_DRAFTER = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3}
# vLLM's own flags for the scheduler keys a spec may set; kv_cache_tokens has none (vLLM sizes the cache in bytes).
VLLM_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size",
    "max_model_len": "--max-model-len",
}


class ServingEngine:
    """One engine's part of a serving study. Subclasses are registered by the serving scheduler they serve with."""

    name: ClassVar[str]
    # The closed-loop benchmark the confirmation plan names, with what it needs beside --study and --rates.
    confirm_script: ClassVar[str]

    def read_policy(self, r: Reader, raw: Any) -> tuple[str, dict[str, type]]:
        """The searched policy family's name and its searchable parameters (name -> the Params class owning it)."""
        raise NotImplementedError

    def settings(self, policy: str, values: dict[str, Any]) -> dict[str, Any]:
        """Every parameter of `policy` at `values`, defaults filled in; ConfigError for values it refuses."""
        raise NotImplementedError

    def read_baseline(self, r: Reader, raw: Any, policy: str, fixed: dict[str, Any]) -> Variant:
        raise NotImplementedError

    def read_drafter(self, r: Reader, section: dict[str, Any]) -> VllmParams | None:
        raise NotImplementedError

    def read_scheduler(self, r: Reader, raw: Any) -> tuple[Any, dict[str, Any]]:
        """The scheduler's settings (a frozen Params) and the keys the spec gave, sorted."""
        raise NotImplementedError

    def none(self, spec: ServingSpec) -> Variant:
        """The reference of every objective: this engine without speculation."""
        raise NotImplementedError

    def serve(
        self, spec: ServingSpec, variant: Variant, arrivals: Any, load: dict[str, Any], costs: ProfileCosts, meta: dict
    ) -> ServingRow:
        raise NotImplementedError

    def digest_parts(self, spec: ServingSpec) -> dict[str, Any]:
        """What the inputs digest holds of this engine's settings (drafter, scheduler)."""
        raise NotImplementedError

    def describe(self, spec: ServingSpec) -> str:
        """The report's words for the scheduler and drafter every trial serves with."""
        raise NotImplementedError

    def configs(self, spec: ServingSpec, values: dict[str, Any]) -> dict[str, Any]:
        """best.yaml's keys that run the configuration `values` of the searched policy on the engine."""
        raise NotImplementedError

    def run_section(self, spec: ServingSpec, values: dict[str, Any], configs: dict[str, Any]) -> list[str]:
        """The report's "Run it on an engine" lines (after its heading)."""
        raise NotImplementedError

    def scheduler_record(self, spec: ServingSpec, values: dict[str, Any]) -> dict[str, Any]:
        """best.yaml's `scheduler`: every scheduler setting the configuration `values` serves with."""
        raise NotImplementedError

    def baseline_record(self, spec: ServingSpec) -> dict[str, Any]:
        """best.yaml's `baseline`: what the closed-loop confirmation serves beside the best."""
        return {"policy": spec.baseline.name, "params": dict(spec.baseline.values)}


REGISTRY: Registry[ServingEngine] = Registry("serving scheduler")


@REGISTRY.register("vllm-v1")
class VllmServing(ServingEngine):
    """vLLM's V1 scheduler: a serving speculation policy deciding K per step over vLLM's n-gram or suffix drafter."""

    confirm_script = "benchmarks/serving_closed_loop.py"

    def read_policy(self, r: Reader, raw: Any) -> tuple[str, dict[str, type]]:
        if raw is None:
            raise r.fail("missing 'policy' (a serving study needs name, policy, search_space and serving)")
        try:
            cls = SPECULATION.get_class(str(raw))
        except ConfigError as err:
            raise r.fail(f"{err} (a serving study tunes a serving speculation policy)", "policy") from None
        if not fields_of(cls.Params):
            raise r.fail(
                f"policy {cls.name} has no parameters to search; it is every study's reference anyway", "policy"
            )
        return cls.name, {k: cls.Params for k in fields_of(cls.Params)}

    def settings(self, policy: str, values: dict[str, Any]) -> dict[str, Any]:
        return make_speculation(policy, values).settings()

    def read_baseline(self, r: Reader, raw: Any, policy: str, fixed: dict[str, Any]) -> Variant:
        found = r.check_keys(raw or {"policy": policy}, ("policy", "params"), "baseline")
        name = str(found.get("policy", policy))
        params = found.get("params") or {}
        if not isinstance(params, dict):
            raise r.fail(
                f"baseline/params must be a mapping of {name}'s parameters, got {params!r}", "baseline", "params"
            )
        try:
            made = make_speculation(name, params)
        except ConfigError as err:
            raise r.fail(f"baseline: {err}", "baseline") from None
        label = name + "".join(f":{k}={v}" for k, v in sorted(params.items()))
        return Variant(name=made.name, values=dict(sorted(params.items())), label=label)

    def read_drafter(self, r: Reader, section: dict[str, Any]) -> VllmParams | None:
        raw = section.get("drafter", DEFAULT_DRAFTER)
        where = ("serving", "drafter")
        if not isinstance(raw, dict):
            raise r.fail(f"serving/drafter must be a mapping of vLLM's drafter keys, got {raw!r}", *where)
        for key in ("num_speculative_tokens", SCHEDULE_KEY):
            if key in raw:
                raise r.fail(f"serving/drafter gives the drafter only; {key} is what the policy decides", *where, key)
        try:
            # K is the policy's: the drafter is built with K = 1, as python -m sim.serve builds it.
            return from_speculative_config({**raw, "num_speculative_tokens": 1}, "serving/drafter")
        except ConfigError as err:
            raise r.fail(str(err), *where) from None

    def read_scheduler(self, r: Reader, raw: Any) -> tuple[Any, dict[str, Any]]:
        keys = r.check_keys(raw or {}, fields_of(SchedulerParams), "serving", "scheduler")
        try:
            scheduler = build_params(SchedulerParams, keys, "scheduler", typed=True)
        except ConfigError as err:
            raise r.fail(f"serving/{err}", "serving", "scheduler") from None
        return scheduler, dict(sorted(keys.items()))

    def none(self, spec: ServingSpec) -> Variant:
        return Variant(name="none", values={}, label="none")

    def serve(
        self, spec: ServingSpec, variant: Variant, arrivals: Any, load: dict[str, Any], costs: ProfileCosts, meta: dict
    ) -> ServingRow:
        assert spec.drafter is not None  # read_drafter always gives vLLM's
        row, _ = run_serving(
            arrivals,
            variant,
            costs=costs,
            profile_meta=meta,
            scheduler=spec.scheduler,
            drafter=spec.drafter,
            slo=spec.slo,
            load=load,
            driver=DRIVER,
            max_tokens=spec.load.max_tokens,
        )
        return row

    def scheduler_record(self, spec: ServingSpec, values: dict[str, Any]) -> dict[str, Any]:
        return dataclasses.asdict(spec.scheduler)

    def digest_parts(self, spec: ServingSpec) -> dict[str, Any]:
        return {"drafter": spec.drafter_keys, "scheduler": dataclasses.asdict(spec.scheduler)}

    def describe(self, spec: ServingSpec) -> str:
        return (
            f"scheduler {json.dumps(dataclasses.asdict(spec.scheduler), sort_keys=True)}; drafter "
            f"{json.dumps(spec.drafter_keys, sort_keys=True)}"
        )

    def configs(self, spec: ServingSpec, values: dict[str, Any]) -> dict[str, Any]:
        """vLLM's speculative_config (one-line JSON, None where vLLM has no setting for the policy), the `vllm serve`
        line, TensorRT-LLM's settings (None where it has none)."""
        policy = make_speculation(spec.policy, values)
        try:
            config = policy.vllm_config(spec.drafter_keys)
        except ConfigError:
            config = None
        text = json.dumps(config, separators=(", ", ": ")) if config is not None else None
        keys = spec.scheduler_keys
        flags = "".join(f" {VLLM_FLAGS[k]} {v}" for k, v in keys.items() if k in VLLM_FLAGS)
        if "chunked_prefill" in keys:
            flags += " --enable-chunked-prefill" if keys["chunked_prefill"] else " --no-enable-chunked-prefill"
        serve = f"vllm serve MODEL{flags}" + (f" --speculative-config {shlex.quote(text)}" if text is not None else "")
        return {"speculative_config": text, "vllm_serve": serve, "trtllm": policy.trtllm_config()}

    def run_section(self, spec: ServingSpec, values: dict[str, Any], configs: dict[str, Any]) -> list[str]:
        policy = make_speculation(spec.policy, values)
        lines: list[str] = []
        if configs["speculative_config"] is not None:
            lines += [
                "vLLM 0.32 (`speculative_config` in best.yaml; MODEL: the model the profile was measured with):",
                "",
                f"    {configs['vllm_serve']}",
                "",
            ]
        else:
            lines += [f"vLLM has no setting for policy {spec.policy}: no speculative_config.", ""]
        if configs["trtllm"] is not None:
            lines += [f"TensorRT-LLM (`trtllm` in best.yaml): `{json.dumps(configs['trtllm'], sort_keys=True)}`.", ""]
        ranges = getattr(policy, "ranges", None)
        if isinstance(ranges, (tuple, list)) and ranges:
            # Shown up to max_num_seqs, the largest batch the engine runs: the last range reaches far beyond it.
            most = spec.scheduler.max_num_seqs
            cap = getattr(policy, "cap", math.inf)  # vLLM's num_speculative_tokens clamps every range's K
            schedule = parse_schedule([list(x) for x in ranges])
            parts = [f"{min(k, cap)} for batch {a}..{min(b, most)}" for a, b, k in schedule if a <= most]
            lines += [f"K by running batch size (up to max_num_seqs {most}): {'; '.join(parts)}.", ""]
        return lines


@REGISTRY.register("llamacpp-slots")
class LlamacppServing(ServingEngine):
    """llama-server's slots: the study searches llama-server's own flags (policy llamacpp). `fixed` holds the server's
    settings every configuration shares (-np, -c, the types' sizes left unsearched): the baseline and `none` (the
    same server with --spec-type none) are served with them too, so every row comes from the same slots."""

    # MODEL.gguf: the GGUF the profile was measured with (the benchmark starts llama-server on it)
    confirm_script = "benchmarks/llamacpp_serving_closed_loop.py --gguf MODEL.gguf"
    POLICY = "llamacpp"

    def read_policy(self, r: Reader, raw: Any) -> tuple[str, dict[str, type]]:
        if raw is not None and raw != self.POLICY:
            raise r.fail(
                f"policy: a llama.cpp serving study searches llama-server's flags (policy {self.POLICY}, or leave "
                f"policy out), got {raw!r}",
                "policy",
            )
        return self.POLICY, {k: LlamaServerParams for k in fields_of(LlamaServerParams)}

    def settings(self, policy: str, values: dict[str, Any]) -> dict[str, Any]:
        """Every setting, those of the types the flags do not enable at llama-server's defaults (the same run: a
        recommendation says only what it means, as a replay study's export does)."""
        return dataclasses.asdict(self.canonical(values))

    def canonical(self, values: dict[str, Any]) -> LlamaServerParams:
        export = export_for(self.POLICY)
        assert export is not None  # policy llamacpp has its export (sim/rows/llamacpp_export.py)
        made: LlamaServerParams = export.canonical(self.params(values))
        return made

    @staticmethod
    def params(values: dict[str, Any]) -> LlamaServerParams:
        made: LlamaServerParams = build_params(LlamaServerParams, values, "llama-server", typed=True)
        return made

    def read_baseline(self, r: Reader, raw: Any, policy: str, fixed: dict[str, Any]) -> Variant:
        """`{flags: "--spec-default"}` (llama-server's flags as pasted) or `{policy: llamacpp, params: {...}}`; the
        fixed settings apply beneath either (the flags or params given win)."""
        found = r.check_keys(raw or {"policy": policy}, ("policy", "params", "flags"), "baseline")
        if "flags" in found:
            if "params" in found:
                raise r.fail("baseline: give flags or params, not both", "baseline")
            text = found["flags"]
            if not isinstance(text, str):
                raise r.fail(f"baseline/flags must be llama-server's flags as one string, got {text!r}", "baseline")
            try:
                given = from_flags(text, "baseline/flags")
            except ConfigError as err:
                raise r.fail(str(err), "baseline", "flags") from None
            default = LlamaServerParams()
            params = {k: v for k, v in dataclasses.asdict(given).items() if getattr(default, k) != v}
            label = text.strip() or NO_SPEC_TYPE
        else:
            if found.get("policy", policy) != self.POLICY:
                raise r.fail(
                    f"baseline/policy: a llama.cpp serving study's baseline is llama-server's flags (policy "
                    f"{self.POLICY}), got {found.get('policy')!r}",
                    "baseline",
                    "policy",
                )
            params = found.get("params") or {}
            if not isinstance(params, dict):
                raise r.fail(
                    f"baseline/params must be a mapping of llama-server's settings, got {params!r}", "baseline"
                )
            label = ""
        values = dict(sorted({**fixed, **params}.items()))
        try:
            made = self.params(values)
        except ConfigError as err:
            raise r.fail(f"baseline: {err}", "baseline") from None
        return Variant(name=self.POLICY, values=values, label=label or " ".join(made.argv()) or NO_SPEC_TYPE)

    def read_drafter(self, r: Reader, section: dict[str, Any]) -> VllmParams | None:
        if "drafter" in section:
            raise r.fail(
                "serving/drafter: llama-server's drafters are its --spec-type flags: search or fix `type` and the "
                "types' sizes (search_space, fixed)",
                "serving",
                "drafter",
            )
        return None

    def read_scheduler(self, r: Reader, raw: Any) -> tuple[Any, dict[str, Any]]:
        keys = r.check_keys(raw or {}, SERVING_KEYS, "serving", "scheduler")
        try:
            build_params(SlotsParams, keys, "scheduler", typed=True)
        except ConfigError as err:
            raise r.fail(f"serving/{err}", "serving", "scheduler") from None
        keys = dict(sorted(keys.items()))
        # The slots' settings at the fixed flags (slots, slot context); each configuration's own come from its flags.
        return keys, keys

    def none(self, spec: ServingSpec) -> Variant:
        return Variant(name=self.POLICY, values={**spec.fixed, "type": NO_SPEC_TYPE}, label="none")

    def serve(
        self, spec: ServingSpec, variant: Variant, arrivals: Any, load: dict[str, Any], costs: ProfileCosts, meta: dict
    ) -> ServingRow:
        params = self.params(variant.values)
        row, _ = run_llamacpp_serving(
            arrivals,
            params,
            label=variant.label,
            costs=costs,
            profile_meta=meta,
            slots=slots_params(params, spec.scheduler),
            slo=spec.slo,
            load=load,
            driver=DRIVER,
            max_tokens=spec.load.max_tokens,
        )
        return row

    def scheduler_record(self, spec: ServingSpec, values: dict[str, Any]) -> dict[str, Any]:
        return dataclasses.asdict(slots_params(self.params(values), spec.scheduler))

    def digest_parts(self, spec: ServingSpec) -> dict[str, Any]:
        # none's flags are part of every objective's reference: the fixed settings name them.
        return {"engine": "llama-server slots", "scheduler": spec.scheduler, "fixed": spec.fixed}

    def describe(self, spec: ServingSpec) -> str:
        shared = self.params(dict(spec.fixed))
        slots = dataclasses.asdict(slots_params(shared, spec.scheduler))
        return (
            f"llama-server's slots {json.dumps(slots, sort_keys=True)} (at the fixed flags; each configuration's "
            f"own flags set its slots, slot context and longest draft)"
        )

    def configs(self, spec: ServingSpec, values: dict[str, Any]) -> dict[str, Any]:
        export = export_for(self.POLICY)
        assert export is not None
        params = self.canonical(values)
        return {"engine": spec.engine, export.key: export.text(params), "llama_server": export.command(params)}

    def run_section(self, spec: ServingSpec, values: dict[str, Any], configs: dict[str, Any]) -> list[str]:
        return [
            "llama-server (`llama_server_flags` in best.yaml; MODEL.gguf: the model the profile was measured with):",
            "",
            f"    {configs['llama_server']}",
            "",
        ]

    def baseline_record(self, spec: ServingSpec) -> dict[str, Any]:
        export = export_for(self.POLICY)
        assert export is not None
        record = super().baseline_record(spec)
        record[export.key] = export.text(self.canonical(spec.baseline.values))
        return record


def serving_engine(scheduler: str) -> ServingEngine:
    """The serving study's part of the engine whose serving scheduler is `scheduler`."""
    return REGISTRY.get_class(scheduler)()


__all__ = ["DEFAULT_DRAFTER", "DRIVER", "REGISTRY", "ServingEngine", "serving_engine"]
