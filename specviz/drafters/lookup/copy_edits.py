"""Learned edits for long copies (AdaPLD's long copies, beyond the AdaPLD paper).

An editing task repeats its edit: a renamed identifier changes at every use, a reformat turns
every tab into spaces. A followed copy (:class:`~specviz.drafters.adapld.control.CopyFollower`)
breaks at the first changed token and is re-found a few tokens later; the text in between says
what the edit was: the source tokens the copy skipped (``source``) were replaced by the tokens
the target wrote instead (``replacement``). :class:`EditMemory` keeps such pairs, and the next
copies draft the replacement wherever the source span occurs again -- so the second and later
uses of a renamed name no longer break the copy.

Conventions: an edit is a pair of token tuples, each 1..``MAX_SPAN`` long (an insertion is
keyed by the source tokens before it, see ``CopyFollower``; a pure deletion is not learned); a
copy applies the longest edit whose source starts
at a position, and never drafts part of a replacement (it stops before one that does not fit).
An edit the target contradicts (a draft rejected inside or at the start of its replacement) is
forgotten. Drafts stay proposals: verification is unchanged, so output is exactly the target's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

MAX_SPAN = 8      # longest source / replacement span learned (an identifier, an indent)
MAX_EDITS = 32    # edits kept at most (the oldest goes first)

Edit = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass
class EditedCopy:
    """A copy with edits applied: the drafted ``tokens`` and, per drafted token, the source span
    it stands for (``spans[i] = (start, end)``: a copied token covers one source position; every
    token of a replacement covers the whole replaced span) and the edit it comes from (or None).
    """

    tokens: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    edit_of: list[Edit | None] = field(default_factory=list)

    @property
    def edits(self) -> list[Edit]:
        """The distinct edits this copy applied, in order."""
        out: list[Edit] = []
        for e in self.edit_of:
            if e is not None and e not in out:
                out.append(e)
        return out

    def source_after(self, accepted: int, start: int) -> tuple[int, Edit | None]:
        """(source position the copy stands at after ``accepted`` drafted tokens were accepted,
        the edit the next drafted token belongs to, if any). A copy accepted in full stands
        after its last token's span; one rejected at token i stands where token i's span starts
        (and an edit rejected there is reported, to be forgotten)."""
        if accepted >= len(self.tokens):
            return (self.spans[-1][1] if self.spans else start), None
        return self.spans[accepted][0], self.edit_of[accepted]


@dataclass
class EditMemory:
    """Source span -> replacement, learned from where copies broke and were re-found."""

    edits: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)

    def learn(self, source: Sequence[int], replacement: Sequence[int]) -> bool:
        """Remember that ``source`` was rewritten as ``replacement``; False (nothing learned) for
        an empty, too long or identical pair."""
        s, r = tuple(int(t) for t in source), tuple(int(t) for t in replacement)
        if not (1 <= len(s) <= MAX_SPAN and 1 <= len(r) <= MAX_SPAN) or s == r:
            return False
        self.edits.pop(s, None)
        self.edits[s] = r
        while len(self.edits) > MAX_EDITS:
            self.edits.pop(next(iter(self.edits)))
        return True

    def forget(self, edit: Edit | None) -> None:
        if edit is not None and self.edits.get(edit[0]) == edit[1]:
            del self.edits[edit[0]]

    def match(self, tokens: Sequence[int], j: int) -> Edit | None:
        """The longest learned edit whose source starts at ``tokens[j]``."""
        best: Edit | None = None
        for s, r in self.edits.items():
            if tokens[j] == s[0] and (best is None or len(s) > len(best[0])) \
                    and tuple(tokens[j:j + len(s)]) == s:
                best = (s, r)
        return best

    def apply(self, tokens: Sequence[int], start: int, length: int, eos) -> EditedCopy:
        """Up to ``length`` tokens copied from ``tokens[start:]`` with every learned edit applied,
        stopping before an EOS, at the end of the context, and before a replacement that would
        not fit."""
        out = EditedCopy()
        j, L = start, len(tokens)
        while j < L and len(out.tokens) < length:
            edit = self.match(tokens, j) if self.edits else None
            s, r = edit if edit is not None else ((int(tokens[j]),), (int(tokens[j]),))
            if len(out.tokens) + len(r) > length or any(t in eos for t in r):
                break
            out.tokens += r
            out.spans += [(j, j + len(s))] * len(r)
            out.edit_of += [edit] * len(r)
            j += len(s)
        return out
