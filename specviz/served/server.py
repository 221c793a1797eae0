"""A local vLLM server on the embedded model (docs/served.md): start, wait until it answers,
stop.

vLLM lives in its own virtualenv (``.venv-vllm``, made by ``scripts/setup_env.sh``): it pins an
older transformers than specviz. :func:`vllm_python` finds that interpreter
(``SPECVIZ_VLLM_PYTHON`` overrides it); :class:`VllmServer` runs vLLM's OpenAI server module
there with per-request detailed spec-decode metrics, on localhost, float32 and eager (the CPU
build), a small KV cache (``VLLM_CPU_KVCACHE_SPACE``, GiB; vLLM's CPU default takes most of the
machine's memory) and its log in a file. ``speculative=None`` serves plain decoding (the vLLM
AR baseline).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..errors import SpecvizError
from .ngram_rule import NgramConfig

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PORT = 8123


def vllm_python() -> Path:
    """The interpreter of the vLLM virtualenv; a SpecvizError saying how to make it otherwise."""
    env = os.environ.get("SPECVIZ_VLLM_PYTHON")
    path = Path(env) if env else ROOT / ".venv-vllm" / "bin" / "python"
    if not path.exists():
        raise SpecvizError(f"no vLLM interpreter at {path}; run `bash scripts/setup_env.sh` "
                           "(it makes .venv-vllm) or set SPECVIZ_VLLM_PYTHON")
    return path


def serve_command(model_dir: str, port: int, speculative: NgramConfig | None,
                  served_name: str = "specviz-default", max_model_len: int = 4096) -> list[str]:
    """The ``vllm serve`` command line (its OpenAI server module; see the module docstring)."""
    cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir), "--served-model-name", served_name,
           "--host", "127.0.0.1", "--port", str(int(port)), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", str(int(max_model_len))]
    if speculative is not None:
        cmd += ["--speculative-config", json.dumps(speculative.to_dict()),
                "--per-request-spec-decode-metrics", "detailed"]
    return cmd


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so a killed CLI or test run leaves no server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # 1 = PDEATHSIG
    except (OSError, AttributeError):   # not Linux: stop() and Ctrl-C still stop it
        pass


def popen_tied(cmd: list[str], **kwargs) -> subprocess.Popen:
    """Popen in its own process group (so :meth:`VllmServer.stop` can stop the engine it
    spawns too) that ends when its parent dies."""
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent, **kwargs)


class VllmServer:
    """A ``vllm serve`` process on localhost (use as a context manager, or start/stop)."""

    def __init__(self, model_dir: str, port: int = DEFAULT_PORT,
                 speculative: NgramConfig | None = NgramConfig(), log_path: str | Path | None = None,
                 kv_cache_gib: int = 1, max_model_len: int = 4096):
        self.port, self.speculative = int(port), speculative
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = serve_command(model_dir, port, speculative, max_model_len=max_model_len)
        self.log_path = Path(log_path) if log_path else None
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),
                    "PYTHONWARNINGS": "ignore::DeprecationWarning"}
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> "VllmServer":
        """Launch (returns at once; :meth:`wait` blocks until it answers)."""
        if self.answers():
            raise SpecvizError(f"something already answers on port {self.port}; stop it or "
                               "choose another --port")
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = popen_tied(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                               env=self.env)
        return self

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait(self, timeout: float = 420.0) -> "VllmServer":
        """Block until ``/health`` answers; a SpecvizError with the log's tail if vLLM exits."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise SpecvizError(f"vLLM exited (status {self.proc.returncode}) before it "
                                   f"answered; {self._tail()}")
            if self.answers():
                return self
            time.sleep(1.0)
        self.stop()
        raise SpecvizError(f"vLLM did not answer within {timeout:.0f} s; {self._tail()}")

    def _tail(self) -> str:
        if not self.log_path or not self.log_path.exists():
            return "no log kept"
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return "last log line: " + (lines[-1][-300:] if lines else "(empty)")

    def stop(self) -> None:
        """Stop the server and the engine processes it spawned (its process group)."""
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        self.proc = None

    def __enter__(self):
        return self.start().wait()

    def __exit__(self, *exc):
        self.stop()


def main_serve(model_dir: str, port: int, speculative: NgramConfig | None,
               log_path: str | None, kv_cache_gib: int) -> int:
    """Foreground server for ``python -m specviz serve-vllm`` (Ctrl-C or TERM stops it and
    vLLM's engine processes)."""
    def interrupt(*_):   # a TERM (a script's kill, a supervisor) stops it as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    srv = VllmServer(model_dir, port, speculative, log_path, kv_cache_gib)
    spec = "no speculation" if speculative is None else json.dumps(speculative.to_dict())
    print(f"starting vLLM on {srv.url} ({spec}; log: {log_path or 'not kept'}) ...",
          file=sys.stderr)
    srv.start()
    try:
        srv.wait()
        print(f"vLLM ready at {srv.url} (Ctrl-C stops it)", file=sys.stderr)
        while srv.proc is not None and srv.proc.poll() is None:
            time.sleep(1.0)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        srv.stop()
