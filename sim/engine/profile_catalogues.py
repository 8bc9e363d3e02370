"""The two bundled profile catalogues: cost profiles (per-width round costs: sim.replay, sim.tune, sim.confirm) in
traces/profiles/, and serving profiles (a batched step's costs: sim.serve) in traces/profiles/serving/. They are
different formats, so a name resolves in its own catalogue only; a name it lacks is looked up in the other, so the
error says which command takes it (or lists the other catalogue's names)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sim.core.errors import ProfileError

ROOT = Path(__file__).resolve().parents[2] / "traces" / "profiles"


@dataclass(frozen=True)
class Catalogue:
    """One folder of bundled profiles: what its files are called and which commands take them."""

    folder: Path
    noun: str  # as its own errors name it
    kind: str  # as the other catalogue's errors name it
    commands: str


REPLAY = Catalogue(ROOT, "profile", "cost profile", "sim.replay, sim.tune and sim.confirm --profile (docs/profiles.md)")
SERVING = Catalogue(
    ROOT / "serving", "serving profile", "serving profile", "sim.serve --profile (docs/serving-profiles.md)"
)


def names(catalogue: Catalogue) -> list[str]:
    return sorted(p.stem for p in catalogue.folder.glob("*.yaml"))


def bundled_path(name: str, catalogue: Catalogue) -> Path:
    """The bundled file of `name` in `catalogue`; a ProfileError naming both catalogues when it has none."""
    path = catalogue.folder / f"{name}.yaml"
    if path.is_file():
        return path
    other = SERVING if catalogue is REPLAY else REPLAY
    hint = (
        f"{name!r} is a {other.kind}, for {other.commands}"
        if name in names(other)
        else f"the {other.kind}s of {other.commands} are another catalogue: {', '.join(names(other))}"
    )
    raise ProfileError(
        f"unknown {catalogue.noun} {name!r}; bundled: {', '.join(names(catalogue))} (or give a path to a YAML file); "
        f"{hint}"
    )
