"""API keys: the `x-api-key` header langgraph_sdk sends, checked against hashed ApiKey rows."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import HttpRequest
from ninja.security import APIKeyHeader

from runs import selectors, services
from runs.models import ApiKey


@dataclass(frozen=True)
class Caller:
    """Who is calling: the actor recorded by services and the resource a key is pinned to."""

    actor: str
    pinned_resource_id: str | None = None
    key_id: int | None = None


ANONYMOUS = Caller(actor="api:anonymous")


# Where the API handler (runsite/handlers.py) leaves an async view's caller, found from memory
# as it created the request, so that ninja's auth need not hop to a thread for it.
_AHEAD = "_runsite_caller"


class ApiKeyAuth(APIKeyHeader):
    param_name = "x-api-key"

    def __init__(self) -> None:
        super().__init__()
        # ninja calls an async auth's __call__ as is, in sync and async operations alike, and
        # awaits what it returns when that is a coroutine (see __call__).
        self.is_async = True

    def __call__(self, request: HttpRequest) -> Any:
        """The caller, or None (ninja answers 401). Every operation's auth, sync or async.

        On a thread (a sync view): looked up here. On the event loop (an async view): a
        coroutine, which ninja awaits, giving the caller found when the request was created
        (`resolve_from_memory`), else looking it up on a thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return super().__call__(request)
        return self._on_the_loop(request)

    async def _on_the_loop(self, request: HttpRequest) -> Caller | None:
        if _AHEAD in request.__dict__:
            ahead: Caller | None = request.__dict__[_AHEAD]
            return ahead
        from runs.api.streaming import db

        caller: Caller | None = await db(super().__call__, request)
        return caller

    def resolve_from_memory(self, request: HttpRequest) -> bool:
        """Find the caller now, on the event loop, for the async view's auth to use, when it
        is known without the database: no key, or a key this process holds (`_RecentKeys`)
        whose use need not be recorded now (`services.api_key_touch_due`). False (nothing set)
        otherwise: the view's auth reads the key on a thread."""
        raw = (self._get_key(request) or "").strip()
        if not raw:
            request.__dict__[_AHEAD] = None if settings.RUNS_API_AUTH else ANONYMOUS
            return True
        api_key = _recent_keys.get(ApiKey.hash_key(raw))
        if api_key is None or services.api_key_touch_due(key=api_key):
            return False
        request.__dict__[_AHEAD] = _caller_of_key(api_key)
        return True

    def kept_keys_due(self) -> bool:
        """Whether a key this process holds is due to be read again (`refresh_kept_keys`)."""
        return _recent_keys.refresh_due()

    def refresh_kept_keys(self) -> None:
        """Read again the held keys in use past half their time (`_RecentKeys.refresh`), off
        any request's path: the server calls it on a thread after an answer."""
        _recent_keys.refresh()

    def authenticate(self, request: HttpRequest, key: str | None) -> Caller | None:
        raw = key.strip() if key else ""
        api_key = _recent_keys.get(ApiKey.hash_key(raw)) if raw else None
        if api_key is None and raw:
            api_key = selectors.api_key_for_raw(raw)
            if api_key is not None:
                _recent_keys.put(api_key)
        if api_key is None:
            # With auth off a stray key (LANGSMITH_API_KEY is sent by the SDK whenever it is
            # set in the environment) must not lock the caller out.
            return None if settings.RUNS_API_AUTH else ANONYMOUS
        services.api_key_touch(key=api_key)
        return _caller_of_key(api_key)


def _caller_of_key(api_key: ApiKey) -> Caller:
    return Caller(
        actor=f"api:{api_key.name}", pinned_resource_id=api_key.resource_id, key_id=api_key.id
    )


class _RecentKeys:
    """The active API keys this process found in the last `RUNS_API_KEY_CACHE_SECONDS`, by
    hash. Requests come from a few keys, in bursts (a client polling, a run waited on and then
    resumed): each one answered from here saves the key's read, a round trip and ~0.3 ms of
    CPU of every API request. Only keys found active are kept (an unknown or revoked key is
    read every time); one saved or deleted in this process is dropped at once (the receivers
    below), and one revoked elsewhere is answered for at most that long after it was read. A
    key used past half that time is read again after the answer that used it (`refresh`), so
    that a key in steady use is never read on a request's path."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._found: dict[str, tuple[float, ApiKey]] = {}
        # Keys used past half their time here, to be read again after the answer that used
        # them (`refresh`), so that a key in steady use is not read on a request's path.
        self._due: set[str] = set()
        self._reading: set[str] = set()  # taken by `refresh`, not marked again meanwhile
        self._lock = threading.Lock()

    def get(self, key_hash: str) -> ApiKey | None:
        found = self._found.get(key_hash)
        if found is None:
            return None
        read_at, api_key = found
        age = time.monotonic() - read_at
        if age >= settings.RUNS_API_KEY_CACHE_SECONDS:
            self._found.pop(key_hash, None)
            return None
        if age >= settings.RUNS_API_KEY_CACHE_SECONDS / 2 and key_hash not in self._reading:
            self._due.add(key_hash)
        return api_key

    def refresh_due(self) -> bool:
        """Whether a key used past half its time awaits `refresh`."""
        return bool(self._due)

    def refresh(self) -> None:
        """Read again the keys used past half their time: each found active is kept for
        another `RUNS_API_KEY_CACHE_SECONDS` from this read, any other is dropped. The server
        calls it on a thread once it has answered (runsite/handlers.py); a key is still never
        answered for longer than that after it was last read."""
        with self._lock:
            due, self._due = self._due - self._reading, set()
            self._reading |= due
        try:
            for key_hash in due:
                api_key = selectors.api_key_for_hash(key_hash)
                if api_key is None:
                    self.forget(key_hash)
                else:
                    self.put(api_key)
        finally:
            with self._lock:
                self._reading -= due

    def put(self, api_key: ApiKey) -> None:
        if settings.RUNS_API_KEY_CACHE_SECONDS <= 0:
            return
        if len(self._found) >= self.LIMIT:
            self._found.clear()
        self._found[api_key.key_hash] = (time.monotonic(), api_key)

    def forget(self, key_hash: str) -> None:
        self._found.pop(key_hash, None)


_recent_keys = _RecentKeys()


@receiver(post_save, sender=ApiKey, dispatch_uid="runs.api.auth.forget_saved_key")
@receiver(post_delete, sender=ApiKey, dispatch_uid="runs.api.auth.forget_deleted_key")
def _forget_key(sender: type[ApiKey], instance: ApiKey, **kwargs: Any) -> None:
    """A key revoked (`services.api_key_revoke` saves it) or deleted in this process is not
    answered for again without being read."""
    _recent_keys.forget(instance.key_hash)


api_key_auth = ApiKeyAuth()


def caller_of(request: HttpRequest) -> Caller:
    auth: Any = getattr(request, "auth", None)
    return auth if isinstance(auth, Caller) else ANONYMOUS
