"""Errors a user can cause. The CLI prints their message as one sentence and exits non-zero."""

import re


class UserError(Exception):
    """A mistake in what the user asked for: bad setting, missing data, impossible partition."""

    exit_code = 2


class DivergedError(UserError):
    """Training produced a non-finite loss; metrics written so far are kept."""

    exit_code = 3


class OutOfMemory(UserError):
    """The GPU cannot hold even one client's training; halving the cohort chunk went as far as it can."""

    exit_code = 4


class Interrupted(UserError):
    """Ctrl-C or SIGTERM stopped a sweep; its state is saved and --resume continues it."""

    exit_code = 130


def first_sentence(error: BaseException) -> str:
    """What a library's exception says, cut to its first sentence and without its full stop, to quote inside ours
    (pyarrow's "... not found in footer. Either the file is corrupted or ..."); its class name where it says nothing."""
    text = (str(error).strip().splitlines() or [""])[0]
    return re.split(r"(?<=[.!?]) (?=[A-Z])", text, maxsplit=1)[0].rstrip(".") or type(error).__name__
