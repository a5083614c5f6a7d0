"""Frame dispatch: handlers keyed by frame type, so a new frame type is added in one place on each side."""
from __future__ import annotations

__all__ = ["Dispatcher"]

from typing import Any, Callable, Iterable

from nebula.wire.frame import Frame, FrameType, WireError

Handler = Callable[..., Any]


class Dispatcher:
    """Calls the handler registered for a frame's type; a type with no handler is refused with `bad_type`.

    `where` names the receiving side in the refusal ("a session from cluster B"), so the sender learns which
    frame types that side accepts."""

    __slots__ = ("_handlers", "where")

    def __init__(self, where: str, handlers: dict[FrameType, Handler] | None = None) -> None:
        self.where = where
        self._handlers: dict[FrameType, Handler] = dict(handlers or {})

    def on(self, types: FrameType | Iterable[FrameType], handler: Handler) -> None:
        """Register `handler` for one frame type or several."""
        for t in (types,) if isinstance(types, FrameType) else types:
            self._handlers[t] = handler

    def accepts(self) -> list[str]:
        """Names of the frame types handled here, in wire order."""
        return [t.name for t in sorted(self._handlers)]

    def __call__(self, frame: Frame, *args: Any) -> Any:
        """Hand `frame` (and `args`) to its handler; WireError `bad_type` if this side takes no such frame."""
        handler = self._handlers.get(frame.header.type)
        if handler is None:
            raise WireError("bad_type", f"unexpected {frame.type.name} frame on {self.where}; "
                            f"it accepts {', '.join(self.accepts())}")
        return handler(frame, *args)
