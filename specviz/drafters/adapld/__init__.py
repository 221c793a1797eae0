"""AdaPLD: adaptive prompt lookup with retrieval from several sources, an adaptive draft length
and branched hypotheses (docs/methods/adapld.md). The drafter is :mod:`.drafter`; its pieces:
settings (:mod:`.params`), source arbitration (:mod:`.retrieve`), per-source statistics and
the copy follower (:mod:`.control`), what a verify teaches it (:mod:`.feedback`), branched
token trees (:mod:`.branches`) and the rounds that skip the search (:mod:`.shortcuts`)."""
from .drafter import SPECS, AdaPLDDrafter

__all__ = ["AdaPLDDrafter", "SPECS"]
