"""One implementation for a synchronous and an asynchronous store: a step that needs the store is written once,
as a generator that yields each store operation (:class:`StoreOp`) and receives its answer; :func:`run` drives
it against a synchronous store, :func:`arun` awaits an asynchronous one. The two drivers are the only twins."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["StoreOp", "arun", "run"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreOp:
    """One store operation a step asks its driver to run: ``fn(*args, **kwargs)``, named ``name`` (the ``op`` of a
    :class:`~agentcache.session.StoreUnavailable`)."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def run(steps: Generator[StoreOp, Any, T], call: Callable[..., Any]) -> T:
    """Drive ``steps`` with ``call(name, fn, *args, **kwargs)`` answering each operation; returns what they return.
    An exception of ``call`` propagates."""
    try:
        op = next(steps)
        while True:
            op = steps.send(call(op.name, op.fn, *op.args, **op.kwargs))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(steps: Generator[StoreOp, Any, T], acall: Callable[..., Awaitable[Any]]) -> T:
    """:func:`run` with ``acall`` awaited for each answer (an asynchronous store)."""
    try:
        op = next(steps)
        while True:
            op = steps.send(await acall(op.name, op.fn, *op.args, **op.kwargs))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
