"""Write the bundled Spec-Bench prompts (traces/prompts/spec-bench/) from Spec-Bench's question.jsonl.

    python traces/prompts/make_spec_bench.py QUESTION.JSONL [--out traces/prompts/spec-bench] [--per-category 10]

Spec-Bench (hemingkx/Spec-Bench, Apache-2.0) has six categories: multi-turn conversation (the 80 MT-bench
questions, in eight subcategories of 10), translation, summarization, question answering, mathematical reasoning
and retrieval-augmented generation (80 each). Per category the rule is fixed, so the selection is reproducible:
the lowest question ids, and for multi-turn conversation one question per subcategory in turn (its lowest id
first), so all eight subcategories appear. Multi-turn questions contribute their first turn only: a recorded
trace is one prompt and one reply. Each prompt is written as CATEGORY-QID.txt, its text exactly the turn's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")
SINGLE = set(CATEGORIES[1:])  # the other categories are MT-bench's subcategories, together "multi_turn"


def select(rows: list[dict], per_category: int) -> list[tuple[str, int, str]]:
    """(category, question id, first turn) for the chosen questions, in category order then question id."""
    by_category: dict[str, list[dict]] = defaultdict(list)
    sub: dict[str, list[dict]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r["question_id"]):
        if row["category"] in SINGLE:
            by_category[row["category"]].append(row)
        else:
            sub[row["category"]].append(row)
    multi: list[dict] = []
    order = sorted(sub, key=lambda name: sub[name][0]["question_id"])  # subcategories as Spec-Bench lists them
    while len(multi) < per_category and any(sub.values()):
        for name in order:
            if sub[name] and len(multi) < per_category:
                multi.append(sub[name].pop(0))
    by_category["multi_turn"] = sorted(multi, key=lambda r: r["question_id"])
    chosen = []
    for category in CATEGORIES:
        rows_here = by_category[category][:per_category]
        if len(rows_here) < per_category:
            raise SystemExit(f"error: {category} has {len(rows_here)} questions, fewer than {per_category}")
        chosen += [(category, r["question_id"], r["turns"][0]) for r in rows_here]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("questions", help="Spec-Bench's data/spec_bench/question.jsonl")
    parser.add_argument("--out", default="traces/prompts/spec-bench", help="folder for the prompt files")
    parser.add_argument("--per-category", type=int, default=10, help="questions per category (default 10)")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.questions).read_text(encoding="utf-8").splitlines() if line]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for category, qid, text in select(rows, args.per_category):
        (out / f"{category}-{qid}.txt").write_text(text + "\n", encoding="utf-8")  # sim.record drops the final newline
    print(f"wrote {len(CATEGORIES) * args.per_category} prompts to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
