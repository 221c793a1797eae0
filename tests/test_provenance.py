"""specviz.provenance: the commit (clean, dirty, outside git), the quoted command, the CPU model
and its fallback, the thread count only when torch is imported. No network, no model."""
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime

import pytest

from specviz import provenance as pv

FIELDS = {"commit", "command", "cpu_model", "cpu_count", "torch_threads", "load_avg", "python",
          "torch", "created"}


def test_every_field_and_json():
    import torch

    p = pv.provenance()
    assert set(p) == FIELDS
    assert json.loads(json.dumps(p)) == p
    assert p["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", p["commit"])
    assert p["cpu_count"] == os.cpu_count() and p["cpu_model"]
    assert p["torch_threads"] == torch.get_num_threads() and p["torch"] == torch.__version__
    assert p["python"] == platform.python_version()
    assert p["load_avg"] is None or len(p["load_avg"]) == 3
    assert datetime.fromisoformat(p["created"]).tzinfo is not None


def test_torch_only_looked_at(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    p = pv.provenance()
    assert p["torch_threads"] is None and "torch" not in sys.modules
    assert p["torch"]    # the installed version, read from the package metadata


def test_command_is_shell_quoted():
    assert pv.command(["bench", "--params", '{"a": 1}', "x y"]) == \
        "bench --params '{\"a\": 1}' 'x y'"
    main = str(pv.Path(pv.__file__).with_name("__main__.py"))
    assert pv.command([main, "bench", "--out", "r"]) == "python -m specviz bench --out r"
    assert pv.command(["/elsewhere/__main__.py", "x"]) == "/elsewhere/__main__.py x"


def test_cpu_model(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 7B13\nprocessor\t: 1\nmodel name\t: other\n")
    assert pv.cpu_model(info) == "AMD EPYC 7B13"
    assert pv.cpu_model(tmp_path / "missing") == (platform.processor() or "unknown")


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_commit_clean_dirty_and_outside_git(tmp_path):
    assert pv.git_commit(tmp_path) == "unknown"          # not a checkout
    repo = tmp_path / "repo"
    repo.mkdir()
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True,
                              capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (repo / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert pv.git_commit(repo) == head
    (repo / "new.txt").write_text("untracked\n")          # untracked files do not count
    assert pv.git_commit(repo) == head
    (repo / "a.txt").write_text("two\n")
    assert pv.git_commit(repo) == head + "-dirty"
    (repo / "sub").mkdir()
    assert pv.git_commit(repo / "sub") == "unknown"       # inside, but not the checkout's top
