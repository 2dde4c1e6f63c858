"""The one exception type users see: it says what was wrong and how to fix it."""


class UsageError(ValueError):
    """Bad input from the user (arguments, config, launcher environment).

    The message is one line that names what was found and the fix. The CLI prints it without a
    traceback and exits with code 2.
    """
