"""The one exception type users see: it says what was wrong and how to fix it."""


class UsageError(ValueError):
    """Bad input from the user (arguments, config, launcher environment).

    The message is one line that names what was found and the fix. The CLI prints it without a
    traceback and exits with code 2.
    """


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type name when it has none): for one-line
    reports of errors raised by torch or third-party code."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
