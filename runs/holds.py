"""A thread's hold on what it would send: kept in a list until its caller sends it.

`live.publishes_held` (run changes for the channel layer) and `services.cancel_notices_held`
(NOTIFYs to workers) let a request's answer leave before what its commits announce.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Hold:
    """One kind of thing a thread may hold. `flush` sends what a block kept when the block is
    left by an exception (its caller will not send it then)."""

    def __init__(self, flush: Callable[[list[Any]], None]) -> None:
        self._local = threading.local()
        self._flush = flush

    def kept(self) -> list[Any] | None:
        """This thread's list while it holds (innermost block), else None."""
        return getattr(self._local, "kept", None)

    @contextmanager
    def held(self) -> Iterator[list[Any]]:
        kept: list[Any] = []
        outer = self.kept()
        self._local.kept = kept
        try:
            yield kept
        except BaseException:
            self._local.kept = outer
            self._flush(kept)
            raise
        self._local.kept = outer
