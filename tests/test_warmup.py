"""runsite/warmup.py: a web process loads its URLs and compiles its templates when the ASGI
application loads, so neither its first request nor its first live push pays for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runsite import warmup

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
import runsite.asgi
from django.template import engines
from django.urls import get_resolver
loader = engines["django"].engine.template_loaders[0]
print(json.dumps({
    "urls_imported": "runsite.urls" in sys.modules and "runs.api.langgraph" in sys.modules,
    "reverse_map_built": get_resolver()._populated,
    "templates": sorted(str(key) for key in loader.get_template_cache),
}))
"""


def test_loading_the_asgi_application_loads_the_urls_and_compiles_the_templates() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    state = json.loads(out.stdout.strip().splitlines()[-1])
    assert state["urls_imported"] is True
    assert state["reverse_map_built"] is True
    for name in (
        "runs/_fragments/run_row.html",
        "runs/_fragments/inbox_row.html",
        "runs/run_list.html",
    ):
        assert name in state["templates"]


def test_a_template_that_does_not_compile_is_logged_and_the_rest_still_compile(
    settings: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "good.html").write_text("{{ value }}")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "also_good.html").write_text("{% if x %}x{% endif %}")
    (tmp_path / "broken.html").write_text("{% if %}")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [tmp_path]}]
    assert warmup.warm_up() == 2
    assert "template broken.html does not compile" in caplog.text


@pytest.mark.postgres
def test_a_web_process_starts_when_its_database_cannot_plan_the_bulk_cancel(db) -> None:
    """The database is not there (not created yet, a wrong name): the warm-up of the bulk
    cancel is logged as not done and the ASGI application loads all the same."""
    from tests.helpers import subprocess_env

    env = subprocess_env(DATABASE_URL="postgres://postgres@127.0.0.1:5432/runsite_no_such_db")
    probe = "import runsite.asgi; print(runsite.asgi.application.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "application"
    assert "the bulk cancel's statements not planned" in done.stderr


@pytest.mark.postgres
def test_the_asgi_application_loads_on_a_running_event_loop(db) -> None:
    """Loaded on a running event loop (an async test importing it first), where Django refuses
    a database call: the application loads, and the database's warm-up is left out."""
    from tests.helpers import probe

    script = (
        "import asyncio, json\n"
        "async def load():\n"
        "    import runsite.asgi\n"
        "    from runsite import warmup\n"
        "    return [runsite.asgi.application.__name__, warmup.warm_up_database()]\n"
        "print(json.dumps(asyncio.run(load())))\n"
    )
    assert probe(script) == ["application", False]
