"""One exception root for draftlab.

`DraftlabError` is the root of every error the project raises on purpose.
`UserError` and its subclasses are mistakes a user can fix (a bad file, an
unknown name, a value out of range): command lines print them as one
`error: ...` line and exit 2. Anything else, a bare `ValueError` included, is a
programming error and keeps its traceback.
"""

from __future__ import annotations


class DraftlabError(Exception):
    """Root of every error draftlab raises on purpose."""


class UserError(DraftlabError):
    """A mistake in the input that the user can fix; the message names the file (and line) and what was expected."""


class ConfigError(UserError):
    """A policy name, parameter or value that cannot be used; the message says what is allowed."""


class TraceError(UserError):
    """A trace file that is not valid trace format v1; the message is `file:line: what was expected`."""


class ProfileError(UserError):
    """A cost profile that cannot be found or is not valid, or a width it cannot price."""


class StudyError(UserError):
    """A study spec or storage that cannot be used; the message names the file, the line and what was expected."""


class RoundsError(UserError):
    """A rounds file (from `sim.replay --rounds-out`) that cannot be read; the message is `file:line: what`."""


class PlotError(UserError):
    """Inputs that cannot be plotted; the message says which and why."""


class ModelError(UserError):
    """A model, device, dtype or prompt that the hardware commands cannot use."""
