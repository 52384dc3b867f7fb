"""Whether a stream is a terminal that redraws a line in place."""

import os


def is_terminal(stream):
    """Whether `stream` is a terminal that redraws a line in place (not TERM=dumb)."""
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
