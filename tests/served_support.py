"""A real vLLM server for the served tests (no mock, no recorded replies): ``vllm serve`` on the
embedded model with ngram speculation and per-request detailed metrics, on a free port. It is
started by the first test that needs it (it answers after about a minute) and stopped when the
tests of that module end, so it neither competes with other tests for the CPU while it starts
nor idles beside them afterwards."""
from __future__ import annotations

import atexit
import socket

import pytest

from tests.browser_support import ARTIFACTS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server():
    from specviz.errors import SpecvizError
    from specviz.models import embedded_model_dir
    from specviz.served.ngram_rule import NgramConfig
    from specviz.served.server import VllmServer, vllm_python

    try:
        vllm_python()
    except SpecvizError as exc:
        pytest.skip(str(exc))
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "vllm-server.log"
    log.write_text("")
    srv = VllmServer(str(embedded_model_dir()), _free_port(), NgramConfig(), log_path=log)
    atexit.register(srv.stop)   # also when the run is cut short
    try:
        srv.start().wait()
        yield srv
    finally:
        srv.stop()
