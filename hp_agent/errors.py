"""User errors: what ``hp-agent`` prints as one line, apart from bugs, which keep their traceback.

A mistake the user can fix (a bad option or config value, a missing file, data set or
optional package, an output folder in the way) raises a :class:`UserError` whose
message says what is wrong and how to fix it. Anything else that escapes a command is a
bug in hp_agent: the CLI prints its traceback and asks for a report. Each subclass is
also the builtin its name ends with, so an ``except ValueError`` or
``pytest.raises(FileNotFoundError)`` written before it existed still catches it.

Nothing here imports from hp_agent: any module may raise these.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; the message names it and the fix."""


class UserValueError(UserError, ValueError):
    """A bad option, argument or value in a data file."""


class UserLookupError(UserError, LookupError):
    """An unknown name (an env, a split's stored walkthrough)."""


class UserNotImplementedError(UserError, NotImplementedError):
    """The chosen env lacks a feature the command needs (e.g. built-in demonstrations)."""


class UserFileNotFoundError(UserError, FileNotFoundError):
    """A file, folder or data set that is not there."""


class UserFileExistsError(UserError, FileExistsError):
    """An output folder that is already there."""


class MissingPackageError(UserError, ImportError):
    """An optional package is not installed; the message gives the command that installs it."""
