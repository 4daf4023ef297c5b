"""uvicorn, the supported alternative to Daphne (docs/deploy.md). The tests of what depends on the
server are marked `every_server` and run under both (tests/e2e/conftest.py); here is what is
uvicorn's own: ASGI's lifespan protocol, and the documented command line."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from runsite import servers
from tests.e2e.conftest import start_site
from tests.helpers import ROOT

pytestmark = [pytest.mark.e2e]


def test_uvicorn_serves_runsite_and_its_lifespan_is_answered(transactional_db, tmp_path) -> None:
    site = start_site(tmp_path, server="uvicorn")
    try:
        answer = httpx.get(f"{site.url}/healthz", timeout=5)
        assert answer.status_code == 200 and answer.headers["server"] == "uvicorn"
        site.proc.terminate()
        site.proc.wait(10)
        output = site.output()
        # Runsite answers ASGI's lifespan messages (runsite/asgi.py): start-up and shutdown
        # complete, no "lifespan unsupported" notice and no traceback.
        assert "Application startup complete" in output
        assert "Application shutdown complete" in output
        assert "unsupported" not in output and "Traceback" not in output
    finally:
        site.stop()


def test_an_unknown_server_is_refused() -> None:
    with pytest.raises(ValueError, match="'hypercorn' is not one of daphne, uvicorn"):
        servers.command("hypercorn", host="127.0.0.1", port=1)


@pytest.mark.parametrize("server", servers.SERVERS)
def test_each_command_line_is_one_its_server_accepts(server: str) -> None:
    # With --proxy-headers, as docs/deploy.md runs them behind a load balancer.
    argv = servers.command(server, host="127.0.0.1", port=1, proxy_headers=True)
    assert argv[-1] == servers.APPLICATION and "--proxy-headers" in argv
    help_text = subprocess.run(
        [*argv[:3], "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in argv[3:-1]:
        if option.startswith("-"):
            assert option in help_text, option


def test_the_command_in_the_deploy_guide_is_one_uvicorn_accepts() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text()
    section = guide.split("### uvicorn instead of Daphne", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    words = block.split()
    assert words[0] == "uvicorn" and words[-1] == servers.APPLICATION
    help_text = subprocess.run(
        [sys.executable, "-m", "uvicorn", "--help"], capture_output=True, text=True, check=True
    ).stdout
    options = [w.split("=", 1)[0] for w in words if w.startswith("--")]
    assert "--timeout-graceful-shutdown" in options and "--proxy-headers" in options
    for option in options:
        assert option in help_text, option
