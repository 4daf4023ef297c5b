"""Sending the outbox: the worker's main loop calls `Deliverer.tick()`, which claims due
deliveries (services.deliveries_claim) and sends each on a small thread pool, so a slow
receiver never holds up run claims. Each attempt is recorded (services.delivery_record)."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from uuid import UUID

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import close_old_connections

from runs import services
from runs.models import Delivery, DeliveryChannel
from runs.webhooks import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookRefused,
    check_url,
    signature,
)

logger = logging.getLogger("runs.delivery")


def body_of(delivery: Delivery) -> bytes:
    # Compact and key-sorted: the same bytes on every attempt of one delivery.
    return json.dumps(
        delivery.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


def headers_of(delivery: Delivery, body: bytes, *, timestamp: str) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Runsite-Webhooks/1",
        DELIVERY_HEADER: str(delivery.id),
        EVENT_HEADER: delivery.event,
        TIMESTAMP_HEADER: timestamp,
    }
    if settings.RUNS_WEBHOOK_SECRET:
        headers[SIGNATURE_HEADER] = signature(
            secret=settings.RUNS_WEBHOOK_SECRET, timestamp=timestamp, body=body
        )
    return headers


def _post(delivery: Delivery) -> tuple[int | None, str, bool]:
    """(status code, error, give up). Redirects are not followed: a 3xx is a failure."""
    try:
        check_url(delivery.target)  # again: the name may resolve elsewhere since creation
    except WebhookRefused as exc:
        return None, f"refused: {exc}", "does not resolve" not in str(exc)
    body = body_of(delivery)
    headers = headers_of(delivery, body, timestamp=str(int(time.time())))
    try:
        response = httpx.post(
            delivery.target,
            content=body,
            headers=headers,
            timeout=settings.RUNS_WEBHOOK_TIMEOUT_SECONDS,
            follow_redirects=False,
        )
    except httpx.TimeoutException:
        return None, f"timeout after {settings.RUNS_WEBHOOK_TIMEOUT_SECONDS:g}s", False
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500], False
    if 200 <= response.status_code < 300:
        return response.status_code, "", False
    return response.status_code, f"HTTP {response.status_code}", False


def _email(delivery: Delivery) -> tuple[int | None, str, bool]:
    group_id = delivery.payload.get("group_id")
    recipients = sorted(
        set(
            get_user_model()
            .objects.filter(groups__id=group_id, is_active=True)
            .exclude(email="")
            .values_list("email", flat=True)
        )
    )
    if not recipients:
        return None, f"group {delivery.target!r} has no active member with an e-mail", True
    try:
        message = EmailMessage(
            subject=delivery.payload.get("subject", "Runsite"),
            body=delivery.payload.get("body", ""),
            to=recipients,
            headers={DELIVERY_HEADER: str(delivery.id)},
        )
        message.send()
    except Exception as exc:  # SMTP errors come in many classes; each is one failed attempt
        return None, f"{type(exc).__name__}: {exc}"[:500], False
    return 250, "", False


def send(delivery: Delivery, *, owner: str) -> str | None:
    """One attempt of a claimed delivery, recorded. Returns the delivery's new status."""
    if delivery.channel == DeliveryChannel.EMAIL:
        code, error, give_up = _email(delivery)
        if not error:
            code = 200  # recorded as sent; SMTP has no HTTP status
    else:
        code, error, give_up = _post(delivery)
    return services.delivery_record(
        delivery_id=delivery.id,
        owner=owner,
        attempt=delivery.attempts,
        status_code=code,
        error=error,
        give_up=give_up,
    )


class Deliverer:
    def __init__(self, *, owner: str, concurrency: int | None = None, wake: threading.Event):
        self.owner = owner
        self.concurrency = concurrency or settings.RUNS_WEBHOOK_CONCURRENCY
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="runsite-delivery")
        self._inflight: set[UUID] = set()
        self._lock = threading.Lock()
        self._wake = wake

    def tick(self) -> int:
        """Claim what is due, up to the free senders, and hand it to them."""
        with self._lock:
            free = self.concurrency - len(self._inflight)
        if free <= 0:
            return 0
        claimed = services.deliveries_claim(owner=self.owner, limit=free)
        for d in claimed:
            with self._lock:
                self._inflight.add(d.id)
            self._pool.submit(self._send, d)
        return len(claimed)

    def _send(self, delivery: Delivery) -> None:
        try:
            send(delivery, owner=self.owner)
        except Exception:
            # Unrecorded: the lease expires and another attempt follows (at least once).
            logger.exception("delivery %s: could not record the attempt", delivery.id)
        finally:
            close_old_connections()
            with self._lock:
                self._inflight.discard(delivery.id)
            self._wake.set()

    def shutdown(self, *, wait: bool) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)


def deliver_due(*, owner: str = "inline", rounds: int = 100) -> int:
    """Send what is due in this thread until nothing is (tests, seed_demo). Returns attempts."""
    done = 0
    for _ in range(rounds):
        claimed = services.deliveries_claim(owner=owner, limit=10)
        if not claimed:
            break
        for d in claimed:
            send(d, owner=owner)
            done += 1
    return done
