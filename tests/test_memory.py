"""RUNS_MALLOC_ARENAS: glibc's malloc arenas of a web process (runsite/memory.py)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from runsite import memory
from tests.helpers import subprocess_env


class _NoMallopt:
    pass


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_the_cap_takes_effect_on_glibc() -> None:
    assert memory.limit_malloc_arenas(2, explicit=True) is True
    assert memory.limit_malloc_arenas(0, explicit=True) is False  # 0: glibc's default kept


def test_an_explicit_cap_without_mallopt_is_refused_and_the_default_skipped(monkeypatch) -> None:
    monkeypatch.setattr(ctypes, "CDLL", lambda *_: _NoMallopt())
    with pytest.raises(ImproperlyConfigured, match="RUNS_MALLOC_ARENAS"):
        memory.limit_malloc_arenas(2, explicit=True)
    assert memory.limit_malloc_arenas(2, explicit=False) is False


def test_a_bad_value_stops_start_up_with_its_name() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=subprocess_env(RUNS_MALLOC_ARENAS="-1", DJANGO_SETTINGS_MODULE="runsite.settings"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "RUNS_MALLOC_ARENAS" in done.stderr
