"""Trace corpora from saved outputs: replies and their prompts tokenized into traces (`python -m sim.ingest`).

tokenize.py loads the tokenizer, build.py bounds and turns a prompt and a reply into a trace and writes traces,
staging.py puts a folder of traces into place as one step, text.py and chat.py read text files and JSON Lines
records, git.py makes edit traces from a repository's history without running anything it configures
([docs/ingest.md](../../docs/ingest.md)).
"""

from sim.core.errors import UserError


class IngestError(UserError):
    """An input `sim.ingest` cannot turn into traces; the message names the file (and line) and what was expected."""


def check_text(value: object, what: str) -> None:
    """Text that goes into a trace must be Unicode that UTF-8 can write: Python holds undecodable bytes of a file
    name or an argument, and JSON holds a lone \\ud800 escape, as surrogates that no encoder takes."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            bad = value[err.start]
            raise IngestError(f"{what} holds {bad!r}, which is not a character (undecodable bytes?)") from None
