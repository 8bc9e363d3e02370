"""Train the distilled governor from hindsight: `python -m sim.train studies/distilled_edits.yaml`.

Reads a training spec (sim/training/spec.py), takes samples along the oracle's schedule on every row, fits the two
acceptance models on all of them, lets the rows choose among the spec's loop and decision candidates, and writes
the model file NAME.json and a configuration NAME.yaml that replays it (`sim.replay --config`); with validation in
the spec, also the held-out evaluation NAME.heldout.{json,md}. Same spec and inputs: the same bytes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from sim import cli

OUT_DIR = "runs/models"

EPILOG = """\
where things go:
  NAME.json (the model), NAME.yaml (a configuration for sim.replay --config and sim.confirm) and, when the spec has
  a validation section, NAME.heldout.json and NAME.heldout.md go into --out-dir (default runs/models, relative to
  the folder you run in). Existing files are replaced only with --force. The bundled models in policies/models/
  are this command's output with --out-dir policies/models (policies/models/README.md).

what it does (docs/governors.md, section 14):
  For every candidate loop setting of the spec's search section, samples are taken at every decision along the
  hindsight oracle's schedule on every trace x profile row: the governor's own features, labelled with which depths
  of the draft came true. Two logistic models are fitted (depth 1; depth k given k - 1), every candidate is replayed
  on the training rows, and the one with no row below the floor and the best geomean is kept. The held-out
  evaluation repeats all of it once per fold, without the fold's rows, and scores the fold's rows only.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m sim.train",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "spec", help="training spec YAML, e.g. studies/distilled_edits.yaml (keys: sim/training/spec.py)"
    )
    parser.add_argument(
        "--out-dir", type=cli.nonblank, default=OUT_DIR, help=f"folder for the files written (default {OUT_DIR})"
    )
    parser.add_argument("--force", action="store_true", help="replace files the command would write that exist")
    parser.add_argument(
        "--no-heldout", action="store_true", help="train the model only; skip the held-out evaluation (much faster)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _train(args, argv))


def _train(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    import yaml

    from policies.distilled import MODELS
    from sim.core.io import check_out_file, check_out_folder, refuse_inputs_as_outputs, write_atomic_all
    from sim.training.heldout import evaluate, markdown, report_json
    from sim.training.spec import load_train_spec
    from sim.training.train import load_bank, model_bytes, train

    spec = load_train_spec(args.spec)
    out = check_out_folder(args.out_dir, "--out-dir")
    heldout = spec.validation is not None and not args.no_heldout
    names = [f"{spec.name}.json", f"{spec.name}.yaml"] + (
        [f"{spec.name}.heldout.json", f"{spec.name}.heldout.md"] if heldout else []
    )
    paths = [check_out_file(out / name, "--out-dir", args.force) for name in names]
    refuse_inputs_as_outputs(paths, [*spec.inputs, *spec.traces], "--out-dir")
    command = shlex.join(["python", "-m", "sim.train", *(sys.argv[1:] if argv is None else argv)])

    def say(message: str) -> None:
        print(f"sim.train {spec.name}: {message}", file=sys.stderr, flush=True)

    say(f"loading {len(spec.traces)} traces x {len(spec.profiles)} profiles")
    bank = load_bank(spec)
    trained = train(bank, spec.traces, lambda m: say(f"training on every row: {m}"))
    document = trained.document
    document["training"]["command"] = command
    # A model written among the bundled ones is named as they are, so the configuration works from any folder.
    bundled = paths[0].resolve().parent == MODELS
    config = {
        "policy": "distilled",
        # absolute: the configuration is read from wherever a later command runs (sim.replay --config)
        "params": {"model": spec.name if bundled else str(paths[0].resolve()), **trained.candidate.loop},
        "notes": f"model {spec.name} and the loop settings its training rows chose; written by {command}",
    }
    files: list[tuple[Path, str | bytes]] = [
        (paths[0], model_bytes(document)),
        (paths[1], yaml.safe_dump(config, sort_keys=True)),
    ]
    if heldout:
        data = evaluate(bank, say)
        data["command"] = command
        files += [(paths[2], report_json(data)), (paths[3], markdown(data, command))]
    write_atomic_all(files)
    chosen = ", ".join(f"{k}={v}" for k, v in trained.document["training"]["chosen"].items())
    say(f"chose {chosen}")
    for path, _ in files:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
