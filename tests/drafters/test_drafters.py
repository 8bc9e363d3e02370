"""Drafters (sim/drafters/, docs/drafters.md): the suffix rules on hand-worked examples (cap from the match length,
branch probabilities and the counting convention, the child tie-break, the min_token_prob cut, score ties, request
vs global tree), the trie against a plain reference, stream eviction, drafting host cost in both timing models,
`--drafter lookup` identical to today, one-line CLI errors, and a study searching drafter and governor parameters."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import BUNDLED_TRACES, ROOT, assert_refused, run_main

from sim.core.protocols import GLOBAL, OUTPUT, PROMPT
from sim.drafters.stream import Stream, World
from sim.drafters.suffix import SuffixDrafter, SuffixParams
from sim.engine.actions import READ, STEP
from sim.engine.costs import DEFAULT_PROFILE, load_profile
from sim.engine.timing import NO_JITTER, Jitter, recurrence_timing, simpy_timing, time_run
from sim.engine.trace import read_trace
from sim.replay import main as replay_main
from sim.rows.config import make_config, read_config_file
from sim.rows.replay import replay, run_trace
from sim.tune import main as tune_main

EMAIL = str(ROOT / "traces" / "email.jsonl")


def suffix(context, k=7, prompt_length=0, world=None, **params):
    return SuffixDrafter(SuffixParams(**params), context, prompt_length, world).draft(context, k)


# --------------------------------------------------------------- hand-worked suffix examples


def test_cap_grows_with_the_match_length():
    """Context 1..8 then `1 2 3` (prompt = the first 8). Every match of `3`, `2 3`, `1 2 3` occurred twice (once
    earlier, once as the context's own suffix), so each walked token has probability 1/2. Caps are m: m=1 drafts
    [4] (score 0.5), m=2 [4, 5] (1.0), m=3 [4, 5, 6] (1.5); `8 1 2 3` occurs only as the suffix itself: stop.
    The best is m=3, whose continuation sits in the prompt."""
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    draft = suffix(context, prompt_length=8)
    assert draft.tokens == [4, 5, 6]
    assert (draft.match_length, draft.source, draft.score, draft.probs) == (3, PROMPT, 1.5, (0.5, 0.5, 0.5))
    # factor 2: caps 2, 4, 6 -> m=3 walks six tokens (8 is followed by the 1 at position 8).
    assert suffix(context, max_spec_factor=2.0).tokens == [4, 5, 6, 7, 8, 1]
    # offset 1.5: cap(1) = floor(2.5) = 2, cap(3) = 4; a negative offset can leave a match no token.
    assert suffix(context, max_spec_offset=1.5).tokens == [4, 5, 6, 7]
    assert suffix(context, max_spec_factor=0.5, max_spec_offset=-1.0).tokens == []  # caps 0, 0, 0 (m=3: 0.5)
    assert suffix(context, max_spec_factor=0.5, max_spec_offset=-0.5).tokens == [4]  # caps 0, 0, 1
    assert SuffixParams(max_spec_factor=1 / 3).cap(3) == 1  # floor in floating point, with a tolerance


def test_branch_probabilities_count_every_occurrence_including_the_suffix():
    """Context `7 1 7 2 7 1 7 3 7`. `7` occurs 5 times (the context's last token included); it was followed by 1
    twice, 2 once, 3 once: the walk takes 1 at 2/5 = 0.4. `7 1` occurred twice, both followed by 7: 0.4 x 2/2.
    `7 1 7` occurred twice, followed once by 2 and once by 3: a tie, broken to the more recent (3), 0.4 x 1/2.
    Then `7 1 7 3` -> 7 at 0.2 x 1/1."""
    context = [7, 1, 7, 2, 7, 1, 7, 3, 7]
    draft = suffix(context, max_spec_factor=4.0)
    assert draft.tokens == [1, 7, 3, 7]
    assert draft.probs == pytest.approx((0.4, 0.4, 0.2, 0.2))
    assert draft.score == pytest.approx(1.2)
    assert (draft.match_length, draft.source) == (1, OUTPUT)  # `3 7` occurs only as the suffix: m stops at 1


def test_equal_counts_go_to_the_most_recent_child():
    """`5 1 5 2 5`: after `5`, 1 and 2 were each seen once; 2 is the more recent."""
    assert suffix([5, 1, 5, 2, 5], k=1).tokens == [2]
    assert suffix([5, 2, 5, 1, 5], k=1).tokens == [1]


def test_min_token_prob_stops_before_an_unlikely_token():
    """The walk of the branch example with min_token_prob 0.3 keeps 1 and 7 (0.4) and stops before 3 (0.2); at 0.5
    even the first token (0.4) is cut, and no longer match exists: no draft."""
    context = [7, 1, 7, 2, 7, 1, 7, 3, 7]
    draft = suffix(context, max_spec_factor=4.0, min_token_prob=0.3)
    assert (draft.tokens, draft.score) == ([1, 7], pytest.approx(0.8))
    assert suffix(context, max_spec_factor=4.0, min_token_prob=0.5).tokens == []
    assert suffix(context, max_spec_factor=4.0, min_token_prob=0.2).tokens == [1, 7, 3, 7]  # 0.2 is not below 0.2


def test_score_ties_go_to_the_longer_match():
    """With k = 2 the cap example's m=2 and m=3 both draft [4, 5] at score 1.0: the longer match wins."""
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    draft = suffix(context, k=2)
    assert (draft.tokens, draft.match_length, draft.score) == ([4, 5], 3, 1.0)
    # k = 1: m=1, 2, 3 all draft [4] at 0.5; the longest match is reported
    assert suffix(context, k=1).match_length == 3


def test_request_tree_against_global_tree():
    """Request `1 2 3 8 1 2`: its own tree drafts [3, 8] at m=2, probabilities 1/2 each, score 1.0. An earlier reply
    `1 2 3 4` (the global tree does not hold the current context, so each count is 1) drafts [3, 4] at score 2.0:
    the global tree wins. An earlier reply `1 2 3` drafts [3] at 1.0: a tie, which the request tree keeps."""
    context = [1, 2, 3, 8, 1, 2]
    alone = suffix(context)
    assert (alone.tokens, alone.score, alone.source) == ([3, 8], 1.0, OUTPUT)
    longer = suffix(context, world=World(Stream([[1, 2, 3, 4]]), 1))
    assert (longer.tokens, longer.score, longer.source, longer.match_length) == ([3, 4], 2.0, GLOBAL, 2)
    tie = suffix(context, world=World(Stream([[1, 2, 3]]), 1))
    assert (tie.tokens, tie.source) == ([3, 8], OUTPUT)
    assert suffix(context, world=World(Stream([[1, 2, 3, 4]]), 0)).tokens == [3, 8]  # request 0 sees no reply


def test_global_tree_counts_over_every_cached_reply():
    """Replies `4 5`, `4 6`, `4 6`: after 4, 6 was seen twice out of three, 5 once: [6] at 2/3."""
    draft = suffix([9, 4], world=World(Stream([[4, 5], [4, 6], [4, 6]]), 3))
    assert (draft.tokens, draft.probs, draft.source) == ([6], pytest.approx((2 / 3,)), GLOBAL)


def test_no_suffix_spans_two_replies():
    """Replies `1 2` and `3 4`: `2 3` never occurred, so a context ending in `2 3` matches only `3` -> [4]."""
    draft = suffix([2, 3], world=World(Stream([[1, 2], [3, 4]]), 2))
    assert (draft.tokens, draft.match_length) == ([4], 1)


def test_tree_depth_limits_match_and_walk():
    """A tree of depth d holds strings of at most d tokens: a match of m tokens can walk d - m further. On the cap
    example with caps of 8 m, depth 2 drafts [4] (m=1; `2 3` sits at depth 2, a leaf), depth 3 [4, 5] (m=1 walks two,
    beating m=2's one), depth 4 [4, 5, 6]; a depth-1 tree holds no continuation at all."""
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    assert suffix(context, max_tree_depth=1, max_spec_factor=8.0).tokens == []
    assert suffix(context, max_tree_depth=2, max_spec_factor=8.0).tokens == [4]
    assert suffix(context, max_tree_depth=3, max_spec_factor=8.0).tokens == [4, 5]
    draft = suffix(context, max_tree_depth=4, max_spec_factor=8.0)
    assert (draft.tokens, draft.match_length) == ([4, 5, 6], 1)


# --------------------------------------------------------------- the trie against a plain reference


def reference(context, k, params: SuffixParams, replies=()):
    """SuffixDecoding's rules written as plainly as possible over substring counts (docs/drafters.md, section 3)."""
    depth = params.max_tree_depth

    def best_of(sequences, within):
        def occurrences(pattern):  # (sequence, end) of each occurrence of pattern completed within the window
            n = len(pattern)
            return [
                (s, i + n)
                for s, seq in enumerate(sequences)
                for i in range(len(seq) - n + 1)
                if n <= depth and i + n <= within[s] and list(seq[i : i + n]) == list(pattern)
            ]

        chosen = ([], 0.0, 0)
        for m in range(1, min(depth, len(context)) + 1):
            pattern = list(context[len(context) - m :])
            parent = occurrences(pattern)
            if not parent:
                break
            cap = min(k, params.cap(m))
            tokens, probs, prob = [], [], 1.0
            while len(tokens) < cap:
                children = {}
                for s, end in parent:
                    if end < within[s] and len(pattern) + 1 <= depth:
                        children.setdefault(sequences[s][end], []).append((s, end + 1))
                if not children:
                    break
                # most occurrences, then the latest (replies are ordered: later sequence, then later end)
                token, seen = max(children.items(), key=lambda item: (len(item[1]), max(item[1])))
                prob *= len(seen) / len(parent)
                if prob < params.min_token_prob:
                    break
                tokens.append(token)
                probs.append(prob)
                pattern, parent = pattern + [token], seen
            if tokens and (not chosen[0] or sum(probs) >= chosen[1]):  # ties to the longer match
                chosen = (tokens, sum(probs), m)
        return chosen

    own = best_of([list(context)], [len(context)])
    other = best_of([list(r) for r in replies], [len(r) for r in replies]) if replies else ([], 0.0, 0)
    return other if other[0] and (not own[0] or other[1] > own[1]) else own


@pytest.mark.parametrize("seed", range(6))
def test_suffix_drafter_agrees_with_the_reference(seed):
    """On random streams over small alphabets (many repeats), built at once or token by token, at every length and
    several k, with and without earlier replies, the drafter gives the reference's tokens, score and match length."""
    rng = random.Random(seed)
    alphabet = rng.randint(2, 5)
    sequence = [rng.randrange(alphabet) for _ in range(60)]
    replies = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 15))] for _ in range(3)]
    params = SuffixParams(
        max_tree_depth=rng.randint(1, 8),
        max_spec_factor=rng.choice([0.5, 1.0, 2.0]),
        max_spec_offset=rng.choice([0.0, 1.0, -1.0]),
        min_token_prob=rng.choice([0.0, 0.1, 0.3]),
    )
    stream = Stream(replies)
    whole = SuffixDrafter(params, sequence, 0, World(stream, len(replies)))
    live = SuffixDrafter(params, [], 0, World(stream, len(replies)))
    for length in range(len(sequence) + 1):
        context = sequence[:length]
        for k in (1, 3, 7):
            expected = reference(context, k, params, replies)
            for drafter in (whole, live):
                draft = drafter.draft(context, k)
                assert draft.tokens == expected[0], (length, k)
                assert draft.score == pytest.approx(expected[1])
                if draft.tokens:
                    assert draft.match_length == expected[2]


# --------------------------------------------------------------- streams


def test_stream_evicts_the_oldest_replies():
    """Replies `1 2 3 4`, `5 6 7 8`, `9 9`; request 3 asking after `1 2`: with room for 3 cached requests it finds the
    first reply; with room for 2 that reply was evicted and nothing matches; with 0 there is no global tree."""
    stream = Stream([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]])
    world = World(stream, 3)
    assert suffix([1, 2], world=world, max_cached_requests=3).tokens == [3, 4]
    assert suffix([1, 2], world=world, max_cached_requests=2).tokens == []
    assert suffix([5, 6], world=world, max_cached_requests=2).tokens == [7, 8]
    assert suffix([5, 6], world=world, max_cached_requests=1).tokens == []
    assert suffix([5, 6], world=world, max_cached_requests=0).tokens == []
    stream.add([1, 2, 0])  # a live stream grows: request 4 sees it, request 3 still does not
    assert suffix([1, 2], world=World(stream, 4), max_cached_requests=1).tokens == [0]
    assert suffix([1, 2], world=world, max_cached_requests=1).tokens == []


def _replay_json(capsys, *args):
    done = run_main(replay_main, [*map(str, BUNDLED_TRACES), "--json", *args], capsys)
    assert done.code == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_as_stream_without_a_global_tree_is_each_trace_alone(capsys):
    """With max_cached_requests=0 a stream changes nothing but the rows' `stream` entry; with the cache the later
    requests' counters change and the first request's cannot (it has seen nothing)."""
    alone = _replay_json(capsys, "--drafter", "suffix", "--compare", "fixed,gated")
    uncached = _replay_json(capsys, "--drafter", "suffix:max_cached_requests=0", "--compare", "fixed,gated")
    streamed0 = _replay_json(
        capsys, "--drafter", "suffix:max_cached_requests=0", "--as-stream", "--compare", "fixed,gated"
    )
    for a, b in zip(uncached, streamed0, strict=True):
        assert b.pop("stream") == {"index": BUNDLED_TRACES.index(Path(a["trace_path"])), "requests": 5}
        assert a == b
    assert [r["time_ms"] for r in alone] == [r["time_ms"] for r in uncached]
    streamed = _replay_json(capsys, "--drafter", "suffix", "--as-stream", "--compare", "fixed,gated")
    assert streamed[:2] == [{**r, "stream": {"index": 0, "requests": 5}} for r in alone[:2]]
    assert [r["proposed"] for r in streamed[2:]] != [r["proposed"] for r in alone[2:]]
    assert "stream" not in alone[0]


def test_stream_order_from_a_manifest(tmp_path, capsys):
    """A manifest lists the traces (relative to its folder) in the stream's order; the first listed is request 0."""
    (tmp_path / "t").mkdir()
    (tmp_path / "sub").mkdir()
    copies = [str(tmp_path / "t" / p.name) for p in BUNDLED_TRACES]
    for original, copy in zip(BUNDLED_TRACES, copies, strict=True):
        Path(copy).write_bytes(original.read_bytes())
    manifest = tmp_path / "sub" / "order.txt"
    manifest.write_text("# last first\n\n" + "".join(f"../t/{p.name}\n" for p in reversed(BUNDLED_TRACES)))
    args = [*copies, "--json", "--drafter", "suffix", "--as-stream", "--stream-order", str(manifest)]
    done = run_main(replay_main, args, capsys)
    assert done.code == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["stream"]["index"] for r in rows] == [4, 3, 2, 1, 0]
    manifest.write_text(f"../t/{BUNDLED_TRACES[0].name}\n")
    assert_refused(
        run_main(replay_main, [*copies, "--as-stream", "--stream-order", str(manifest)], capsys),
        "does not list",
    )


# --------------------------------------------------------------- lookup stays as it was; governors over suffix


@pytest.mark.parametrize("policy", ["off", "fixed", "graded", "gated", "heuristic"])
def test_drafter_lookup_is_the_default_to_the_last_bit(policy, capsys):
    """`--drafter lookup` (and `drafter: lookup` in the flat settings) gives the very rows, labels and settings of
    no drafter at all."""
    plain = _replay_json(capsys, "--policy", policy)
    named = _replay_json(capsys, "--policy", policy, "--drafter", "lookup")
    assert plain == named
    assert make_config(policy, {"drafter": "lookup"}) == make_config(policy, {})
    assert "drafter" not in plain[0]["params"] and plain[0]["label"] == policy


@pytest.mark.parametrize("policy", ["off", "fixed", "graded", "gated", "heuristic"])
def test_mlxcel_governors_run_over_suffix_within_their_budget(policy):
    """Under suffix every round proposes at most the governor's budget, and what the loop emits is the trace."""
    trace = read_trace(BUNDLED_TRACES[0])
    config = make_config(policy, {"drafter": "suffix"})
    result = run_trace(trace, config, keep_iterations=True)
    assert result.tokens == list(trace.tokens[: len(result.tokens)])
    assert all(it.proposal_len <= it.budget for it in result.iterations or [])
    if policy == "off":
        assert result.counters.proposed == 0


def test_suffix_labels_settings_and_config_files(tmp_path):
    """A non-default drafter names itself in labels and settings; a config file's `drafter:` is the same as those
    settings under params."""
    config = make_config("gated", {"drafter": "suffix", "drafter.min_token_prob": "0.2"})
    assert config.label() == "gated:drafter=suffix:drafter.min_token_prob=0.2"
    assert config.settings()["drafter.max_tree_depth"] == 24
    path = tmp_path / "c.yaml"
    path.write_text("policy: gated\ndrafter: suffix:min_token_prob=0.2\n")
    assert read_config_file(path)[0] == config
    path.write_text("policy: gated\nparams: {drafter: suffix, drafter.min_token_prob: 0.2}\n")
    assert read_config_file(path)[0] == config


# --------------------------------------------------------------- drafting host cost


def test_drafting_host_cost_in_both_timing_models():
    """A lookup of 0.25 ms before each action, plus 0.5 ms per proposed token, delays the host exactly that much in
    both models, to the last bit, on every bundled trace (with and without jitter); 0 is today's time."""
    profile = load_profile(DEFAULT_PROFILE)
    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        prompt = len(trace.prompt_tokens)
        result = run_trace(trace, make_config("gated", {"drafter": "suffix"}))
        for jitter in (NO_JITTER, Jitter(0.05, 7)):
            common = {"prompt_tokens": prompt, "stopped_on_eos": True, "jitter": jitter}
            free = time_run(result, profile, **common, model=recurrence_timing)
            zero = time_run(result, profile, **common, model=simpy_timing, drafting=(0.0, 0.0))
            assert free.time_ms == zero.time_ms
            slow = time_run(result, profile, **common, model=simpy_timing, keep_host_times=True, drafting=(0.25, 0.5))
            fast = time_run(
                result, profile, **common, model=recurrence_timing, keep_host_times=True, drafting=(0.25, 0.5)
            )
            assert slow.timing.host_ms == fast.timing.host_ms and slow.time_ms == fast.time_ms
            assert slow.plain_ms == free.plain_ms  # plain decoding drafts nothing
            assert slow.time_ms > free.time_ms


def test_drafting_host_cost_by_hand():
    """P = 10, S(1) = 12 (g = 2), S(3) = 19, prefill 100. Actions [3, STEP, READ] with a lookup of 1 ms before the
    verify (2 tokens proposed, 0.5 ms each) and one of 1 ms before the step: 100 + 1 + 1 + 19 = 121 for the verify;
    the step starts at 121 + 1 = 122, ends 132; the read adds g: 134."""
    from sim.engine.costs import profile_from_dict

    profile = profile_from_dict(
        {"pipelined_ms": 10.0, "sync_ms": [12.0, 15.0, 19.0], "prefill": {"fixed_ms": 100.0}}, "test"
    )
    for timer in (simpy_timing, recurrence_timing):
        timing = timer([3, STEP, READ], [5, 8, 8], profile, 4, keep_host_times=True, drafting_ms=[2.0, 1.0, 0.0])
        assert timing.host_ms == (121.0, 122.0, 134.0)


def test_host_cost_is_charged_per_lookup_in_replay():
    """`drafter.host_ms_per_lookup` adds exactly that per drafter call of the loop to a synchronous-only run."""
    trace = read_trace(EMAIL)
    profile = load_profile(DEFAULT_PROFILE)
    base = make_config("fixed", {"drafter": "suffix", "plain_rounds_before_pipelining": 1000})
    costly = make_config(
        "fixed", {"drafter": "suffix", "plain_rounds_before_pipelining": 1000, "drafter.host_ms_per_lookup": 0.5}
    )
    lookups = len(run_trace(trace, base).lookups)
    assert lookups == run_trace(trace, base).counters.rounds  # one lookup per synchronous round
    assert replay(trace, costly, profile).time_ms == pytest.approx(replay(trace, base, profile).time_ms + 0.5 * lookups)


# --------------------------------------------------------------- command-line errors


@pytest.mark.parametrize(
    ("drafter", "fragments"),
    [
        ("nope", ["unknown drafter 'nope'", "registered: llamacpp, lookup, ngram, suffix, vllm_suffix"]),
        ("suffix:min_token_prob=2", ["min_token_prob must be in 0..1, got 2.0"]),
        ("suffix:max_tree_depth=0", ["max_tree_depth must be in 1..64"]),
        ("suffix:foo=1", ["unknown drafter suffix parameter(s) foo", "allowed: max_tree_depth"]),
        ("suffix:depth", ["expected key=value", "'depth'"]),
        ("lookup:host_ms_per_lookup=-1", ["host_ms_per_lookup must be in 0..1000"]),
    ],
)
def test_bad_drafter_is_one_error_line(capsys, drafter, fragments):
    assert_refused(run_main(replay_main, [EMAIL, "--drafter", drafter], capsys), *fragments)


def test_a_drafter_setting_given_twice_is_refused(capsys):
    both = [EMAIL, "--drafter", "suffix:min_token_prob=0.2", "--set", "drafter=lookup", "--set", "drafter.x=1"]
    assert_refused(run_main(replay_main, both, capsys), "--drafter and --set both set drafter: give each once")
    key = [EMAIL, "--drafter", "suffix:min_token_prob=0.2", "--set", "drafter.min_token_prob=0.3"]
    assert_refused(run_main(replay_main, key, capsys), "both set drafter.min_token_prob")
    on_top = run_main(replay_main, [EMAIL, "--drafter", "suffix", "--set", "drafter.min_token_prob=0.3"], capsys)
    assert on_top.code == 0 and "drafter=suffix" in on_top.stdout and "min_token_prob=0.3" in on_top.stdout


def test_stream_flags_refused_in_one_line(capsys, tmp_path):
    assert_refused(run_main(replay_main, [EMAIL, "--stream-order", "x"], capsys), "give it with --as-stream")
    out = tmp_path / "r.jsonl"
    assert_refused(run_main(replay_main, [EMAIL, "--as-stream", "--rounds-out", str(out)], capsys), "--rounds-out")


# --------------------------------------------------------------- a study over drafter and governor parameters


def test_study_searches_drafter_and_governor_parameters(tmp_path, monkeypatch, capsys):
    """A spec with `drafter: suffix` searches drafter.* beside a gated parameter on SQLite; its best.yaml replays."""
    spec = tmp_path / "studies" / "sfx.yaml"
    spec.parent.mkdir()
    spec.write_text(
        "name: sfx\npolicy: gated\ndrafter: suffix\n"
        "search_space:\n  full_at: {low: 0.5, high: 3.0}\n  drafter.min_token_prob: {low: 0.05, high: 0.5}\n"
        "  drafter.max_spec_factor: {low: 0.5, high: 4.0}\n"
        f"fixed: {{drafter.max_tree_depth: 16}}\ntraces: [{EMAIL}]\nprofiles: [gb10-qwen3-8b-4bit]\n"
        "sampler: {name: random, seed: 1}\nn_trials: 3\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    done = run_main(tune_main, [str(spec), "--no-plots"], capsys)
    assert done.code == 0, done.stderr
    import optuna

    study = optuna.load_study(study_name="sfx", storage=f"sqlite:///{tmp_path}/runs/sfx.db")
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(trials) == 3
    assert {"full_at", "drafter.min_token_prob", "drafter.max_spec_factor"} == set(trials[0].params)
    assert len({t.params["drafter.min_token_prob"] for t in trials}) == 3
    config = read_config_file(tmp_path / "runs" / "sfx" / "best.yaml")[0]
    assert (config.drafter.name, config.drafter.params.max_tree_depth) == ("suffix", 16)
    row = replay(read_trace(EMAIL), config, load_profile("gb10-qwen3-8b-4bit"))
    best = max(trials, key=lambda t: t.values[0])
    assert row.speedup == pytest.approx(best.values[0], rel=1e-12)


def test_spec_refuses_drafter_parameters_without_a_drafter(tmp_path):
    from sim.core.errors import StudyError
    from sim.tuning.specs.replay import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: s\npolicy: gated\nsearch_space:\n  drafter.min_token_prob: {{low: 0.1, high: 0.5}}\n"
        f"traces: [{EMAIL}]\nprofiles: [gb10-qwen3-8b-4bit]\n"
    )
    with pytest.raises(StudyError, match=r"s.yaml:4: unknown key 'drafter.min_token_prob'"):
        load_spec(path)
    path.write_text(
        f"name: s\npolicy: gated\ndrafter: sufix\nsearch_space:\n  full_at: {{low: 0.5, high: 3}}\n"
        f"traces: [{EMAIL}]\nprofiles: [gb10-qwen3-8b-4bit]\n"
    )
    with pytest.raises(StudyError, match=r"s.yaml:3: unknown drafter 'sufix'"):
        load_spec(path)


@pytest.mark.parametrize("drafter", ["lookup", "suffix"])
def test_a_live_drafter_decodes_as_replay_does(drafter):
    """A live drafter (its own tree, extended as tokens land, as on hardware) gives the loop the very counters and
    actions of replay's drafter indexed over the whole trace."""
    from sim.drafters.registry import live_drafter
    from sim.engine.mlxcel import run
    from sim.engine.trace import TraceTarget

    for path in BUNDLED_TRACES:
        trace = read_trace(path)
        config = make_config("gated", {"drafter": drafter})
        target = TraceTarget(trace.tokens, trace.eos_id, trace.stop == "eos")
        prompt = list(trace.prompt_tokens)
        live = run(
            target,
            config.governor(),
            config.loop,
            prompt,
            trace.max_tokens,
            live_drafter(config.drafter, config.loop, prompt),
        )
        replayed = run_trace(trace, config)
        assert (live.counters, live.actions) == (replayed.counters, replayed.actions)


def test_study_evaluation_charges_the_drafters_host_cost():
    """The study evaluator's rows (recurrence timing) equal replay's for a drafter with a host cost."""
    from sim.tuning.evaluate.replay import MatrixEvaluator

    trace, profile = read_trace(EMAIL), load_profile(DEFAULT_PROFILE)
    config = make_config("gated", {"drafter": "suffix", "drafter.host_ms_per_lookup": 0.3})
    row = MatrixEvaluator([trace], [profile]).evaluate(config)[0]
    expected = replay(trace, config, profile, model=recurrence_timing)
    assert (row.time_ms, row.plain_time_ms) == (expected.time_ms, expected.plain_time_ms)
    assert row.time_ms > replay(trace, make_config("gated", {"drafter": "suffix"}), profile).time_ms
