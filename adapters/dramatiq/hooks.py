"""dramatiq's middleware hooks, called only on the middleware that has them.

dramatiq's ``Broker.emit_before``/``emit_after`` call every middleware's hook
for every signal, the base class's no-ops included: with this service's ten
middleware, about 40 calls per message (before and after the actor, before
and after its ack), most of them doing nothing. :class:`OwnHooksOnly` makes
the same calls, in the same order, with the same error handling, skipping
only the no-ops of :class:`dramatiq.Middleware` that a middleware did not
override. The list per signal is made once, and again whenever the broker's
middleware list changes (``add_middleware``, or a list of another length).
"""

from __future__ import annotations

from typing import Any, Callable

from dramatiq.middleware import Middleware, MiddlewareError

Hook = tuple[Callable[..., Any], Middleware]


def own_hooks(middleware: list[Middleware], name: str) -> list[Hook]:
    """The bound hooks ``name`` of the middleware that define it themselves, in list order."""
    base = getattr(Middleware, name, None)
    return [(getattr(m, name), m) for m in middleware
            if getattr(type(m), name, None) is not base or name in getattr(m, "__dict__", ())]


class OwnHooksOnly:
    """A mixin for a dramatiq broker (listed before it): emit_before and emit_after
    as dramatiq's, over :func:`own_hooks`."""

    middleware: list[Middleware]
    logger: Any

    def _hooks(self, name: str, reverse: bool = False) -> list[Hook]:
        cache: dict[tuple[str, bool], tuple[int, list[Hook]]] = self.__dict__.setdefault("_own_hooks", {})
        known = cache.get((name, reverse))
        if known is not None and known[0] == len(self.middleware):
            return known[1]
        hooks = own_hooks(self.middleware, name)
        if reverse:
            hooks.reverse()
        cache[(name, reverse)] = (len(self.middleware), hooks)
        return hooks

    def add_middleware(self, middleware: Middleware, **kwargs: Any) -> None:
        super().add_middleware(middleware, **kwargs)  # type: ignore[misc]
        self.__dict__.pop("_own_hooks", None)

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        name = "before_" + signal
        for hook, middleware in self._hooks(name):
            try:
                hook(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", name, middleware, exc_info=True)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        name = "after_" + signal
        for hook, middleware in self._hooks(name, reverse=True):
            try:
                hook(self, *args, **kwargs)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", name, middleware, exc_info=True)
