"""Webhook rules without state: which URLs may be called (SSRF), how a POST is signed, and when
a failed delivery is tried again. Services check URLs with it at create time, the deliverer
again before every POST (a name may resolve elsewhere by then)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import random
import socket
from urllib.parse import urlsplit

from django.conf import settings

from runs.exceptions import ValidationFailed

SIGNATURE_HEADER = "X-Runsite-Signature"
DELIVERY_HEADER = "X-Runsite-Delivery"
EVENT_HEADER = "X-Runsite-Event"
TIMESTAMP_HEADER = "X-Runsite-Timestamp"


class WebhookRefused(ValueError):
    """The URL may not be called; the message says why."""


def _address_refused(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def check_url(url: str, *, allow_private: bool | None = None) -> None:
    """Raise WebhookRefused unless `url` is http(s) and every address its host resolves to is
    public (or RUNS_WEBHOOK_ALLOW_PRIVATE is on). Resolution failures are refusals."""
    allow = settings.RUNS_WEBHOOK_ALLOW_PRIVATE if allow_private is None else allow_private
    if len(url) > 2000:
        raise WebhookRefused("longer than 2000 characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookRefused("only http and https URLs are allowed")
    if not parts.hostname:
        raise WebhookRefused("the URL has no host")
    if parts.username or parts.password:
        raise WebhookRefused("credentials in the URL are not allowed (use the signature)")
    if allow:
        return
    try:
        infos = socket.getaddrinfo(
            parts.hostname,
            port or (443 if parts.scheme == "https" else 80),
            type=socket.SOCK_STREAM,
        )
    except (OSError, UnicodeError) as exc:
        raise WebhookRefused(f"the host {parts.hostname!r} does not resolve ({exc})") from None
    for info in infos:
        address = str(info[4][0])
        if _address_refused(address):
            raise WebhookRefused(
                f"the host {parts.hostname!r} resolves to {address}, a private, loopback, "
                "link-local or reserved address (set RUNS_WEBHOOK_ALLOW_PRIVATE=1 to allow)"
            )


def validate_url(url: str, *, field: str) -> None:
    """check_url as the 422 an edge shows, naming `field`."""
    try:
        check_url(url)
    except WebhookRefused as exc:
        raise ValidationFailed.field(field, str(exc), detail=f"{field} refused: {exc}") from None


def signature(*, secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256(secret, "<timestamp>.<body>"): the timestamp is signed
    too, so a captured request cannot be replayed later with a fresh timestamp."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def backoff_seconds(attempts: int) -> float:
    """Delay before try `attempts + 1`: base * 2^(attempts-1), capped, with ±20% jitter so
    receivers that failed together are not hit together again."""
    base = settings.RUNS_WEBHOOK_BACKOFF_SECONDS * (2 ** max(0, attempts - 1))
    delay = min(base, settings.RUNS_WEBHOOK_BACKOFF_MAX_SECONDS)
    return delay * random.uniform(0.8, 1.2)
