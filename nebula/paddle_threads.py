"""Paddle's dygraph mode across threads: Paddle is imported in the thread that starts the others.

Paddle keeps its dygraph tracer per thread (`paddle.base.framework.global_var`, a `threading.local`); a thread takes
its tracer, when it first touches Paddle, from a module global. When Paddle is first imported in a thread other than
the main one, that global is empty once the importing thread has ended (measured with Paddle 3): the main thread, and
every thread started afterwards, then run in static mode (`paddle.randn` returns a `pir.Value`, and a model's
forward fails). Imported in the main thread first, threads that start and end leave it as it was. So code that starts
threads which use Paddle imports it in its own thread before them: called from the main thread (as `nebula fl start`
and the recipes call `run_actors`) that holds for good; called first from another thread, only while that one lives."""
from __future__ import annotations

__all__ = ["dygraph_before_threads"]


def dygraph_before_threads() -> None:
    """Import Paddle in the calling thread (before it starts threads that use Paddle): see the module docstring."""
    import paddle  # noqa: F401  (the import is the point: it runs Paddle's dygraph setup in this thread)
