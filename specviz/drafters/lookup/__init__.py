"""The lookup pieces that AdaPLD and DFlash + AdaPLD share (docs/methods/adapld.md): the n-gram
index and its ranked candidates (:mod:`.index`), semantic window retrieval (:mod:`.semantic`),
the offline history store of earlier replies (:mod:`.history_store`) with their reply
openings (:mod:`.openings`), and copies with learned edits (:mod:`.copy_edits`)."""
from .copy_edits import EditedCopy, EditMemory
from .history_store import HistoryStore
from .index import Candidate, NgramIndex
from .openings import OpeningIndex
from .semantic import WindowIndex

__all__ = ["Candidate", "EditMemory", "EditedCopy", "HistoryStore", "NgramIndex",
           "OpeningIndex", "WindowIndex"]
