"""A real vLLM server for the served tests (no mock, no recorded replies): ``vllm serve`` on the
embedded model with ngram speculation and per-request detailed metrics, on a free port. It takes
a minute or two to answer, so it is started as soon as the run's tests are collected (when one of
them asks for it) and waited for by the first test that needs it; stopped at the end."""
from __future__ import annotations

import atexit
import socket

import pytest

from tests.browser_support import ARTIFACTS

_STATE: dict = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm_early(session) -> None:
    """Start the server in the background if a selected test uses the ``vllm_server`` fixture."""
    if not any("vllm_server" in getattr(it, "fixturenames", ()) for it in session.items):
        return
    from specviz.errors import SpecvizError
    from specviz.models import embedded_model_dir
    from specviz.served.ngram_rule import NgramConfig
    from specviz.served.server import VllmServer, vllm_python

    try:
        vllm_python()
    except SpecvizError as exc:
        _STATE["skip"] = str(exc)
        return
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "vllm-server.log"
    log.write_text("")
    srv = VllmServer(str(embedded_model_dir()), _free_port(), NgramConfig(), log_path=log)
    _STATE["srv"] = srv.start()
    atexit.register(srv.stop)


@pytest.fixture(scope="session")
def vllm_server():
    if "skip" in _STATE:
        pytest.skip(_STATE["skip"])
    srv = _STATE.get("srv")
    if srv is None:
        pytest.skip("the vLLM server was not started (no selected test asked for it)")
    srv.wait()
    yield srv
    srv.stop()
