"""Two guards, each a decorator, so that the method under it reads as the idea it is.

``@one_thread_at_a_time``: an object that is not safe to share between threads refuses a second
thread clearly (RuntimeError) instead of corrupting its state. ``@all_or_nothing``: if the method
raises (a refusal, an interrupt), the object is as it was before the call; the object says what to
save and restore in its ``rollback_point()`` context manager. The notebooks list the methods with
their decorators, one line each above the body.
"""
from __future__ import annotations

import functools
import threading
import weakref

_guards: "weakref.WeakKeyDictionary[object, _Guard]" = weakref.WeakKeyDictionary()
_making = threading.Lock()


class _Guard:
    def __init__(self):
        self.lock, self.owner = threading.Lock(), None


def _guard_of(obj) -> _Guard:
    guard = _guards.get(obj)
    if guard is None:
        with _making:
            guard = _guards.setdefault(obj, _Guard())
    return guard


def one_thread_at_a_time(method):
    """Every method so marked shares one lock per object, taken without waiting.

    A second thread entering any of them while one runs gets a RuntimeError that names the method;
    the thread already inside may call another (a guarded method calling a guarded method).
    """
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        guard, me = _guard_of(self), threading.get_ident()
        if guard.owner == me:
            return method(self, *args, **kwargs)
        if not guard.lock.acquire(blocking=False):
            owner = type(self).__name__
            raise RuntimeError(f"{owner}.{method.__name__} was called while another thread is inside this {owner}, "
                               f"which is not thread-safe: give each thread its own, or call it from one thread")
        guard.owner = me
        try:
            return method(self, *args, **kwargs)
        finally:
            guard.owner = None
            guard.lock.release()

    return guarded


def all_or_nothing(method):
    """If the method raises, ``self.rollback_point()`` puts the object back as it was before the call."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        with self.rollback_point():
            return method(self, *args, **kwargs)

    return guarded
