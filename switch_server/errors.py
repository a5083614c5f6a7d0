"""The switch's own error: a file, setting or address it cannot use; the message names it and the fix."""
from __future__ import annotations

__all__ = ["SwitchError"]


class SwitchError(Exception):
    """The switch cannot start (or reload): a file or setting is unusable; the message names it and the fix."""
