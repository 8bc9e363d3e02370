"""The arms of `sim.confirm`, built without torch: a `--config` arm is named by a label short enough for a table
column (`STUDY trial N` from a best.yaml's notes, else `config:FILE`), with its full parameters beside it in the
result file; two files that would share a label are told apart by their paths."""

from __future__ import annotations

from conftest import ROOT

from sim.hardware.arms import PLAIN, build_arms

BEST = ROOT / "studies" / "gated_gb10" / "best.yaml"


def test_a_config_arm_is_labelled_by_its_study_trial_or_its_file(tmp_path):
    """A best.yaml whose notes name its study and trial is `STUDY trial N`; a file without such notes is
    `config:FILE`; the result file keeps the file and the full parameter string."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("policy: gated\nparams: {max_draft: 5}\n")
    arms = build_arms("gated", [str(BEST), str(mine)])
    assert [a.label for a in arms] == [PLAIN, "gated", "gated_gb10 trial 29", "config:mine.yaml"]
    assert max(len(a.label) for a in arms) <= 20
    best = arms[2].as_dict()
    assert best["file"] == str(BEST) and best["policy"] == "gated"
    assert best["parameters"] == arms[2].config.label() and len(best["parameters"]) > 150
    assert arms[3].as_dict()["parameters"] == "gated:max_draft=5"
    assert "file" not in arms[1].as_dict() and arms[0].as_dict() == {"label": PLAIN, "policy": PLAIN}


def test_two_files_with_one_short_label_are_told_apart_by_their_paths(tmp_path):
    """Two best.yaml without study notes in different folders: each label adds its path; the labels stay unique."""
    paths = []
    for folder, draft in (("a", 3), ("b", 4)):
        path = tmp_path / folder / "best.yaml"
        path.parent.mkdir()
        path.write_text(f"policy: gated\nparams: {{max_draft: {draft}}}\n")
        paths.append(str(path))
    labels = [a.label for a in build_arms(None, paths)]
    assert labels == [PLAIN, f"config:best.yaml ({paths[0]})", f"config:best.yaml ({paths[1]})"]
