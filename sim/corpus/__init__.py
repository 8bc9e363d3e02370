"""Trace corpora from saved outputs: replies and their prompts tokenized into traces (`python -m sim.ingest`).

tokenize.py loads the tokenizer, build.py turns a prompt and a reply into a trace and writes traces, text.py and
chat.py read text files and JSON Lines records, git.py makes edit traces from a repository's history
([docs/ingest.md](../../docs/ingest.md)).
"""

from sim.errors import UserError


class IngestError(UserError):
    """An input `sim.ingest` cannot turn into traces; the message names the file (and line) and what was expected."""
