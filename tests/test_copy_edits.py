"""Long copies learn the edit of an editing task (a renamed name, an insertion) where a
broken copy is re-found, and apply it at the next occurrences; a contradicted edit is forgotten."""
from __future__ import annotations

import random

from specviz.drafters.adapld.drafter import AdaPLDDrafter
from specviz.drafters.lookup.copy_edits import MAX_SPAN, EditMemory

from test_adapld import synthetic_run

OLD, NEW = (901, 902), (777,)        # a two-token name renamed to a one-token name


def _source(n: int = 200, uses=(20, 60, 100, 140, 180), seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    doc = rng.sample(range(100, 800), n)       # no repeated token outside the name
    for u in sorted(uses, reverse=True):
        doc[u:u] = list(OLD)
    return doc


def _rewrite(doc: list[int], old=OLD, new=NEW) -> list[int]:
    out, i = [], 0
    while i < len(doc):
        if tuple(doc[i:i + len(old)]) == old:
            out += list(new)
            i += len(old)
        else:
            out.append(doc[i])
            i += 1
    return out


def _run(doc: list[int], want: list[int], learn: bool = True, rounds: int = 40):
    prompt = doc + [7, 7] + want[:3]              # "... rewrite it:" and the reply has begun
    drafter = AdaPLDDrafter(semantic="off", history="off")
    if not learn:
        drafter.follower.memory.learn = lambda *a: False
        drafter._reset_state = lambda: None       # keep the crippled memory across begin()

    def truth(tokens, draft):
        k = len(tokens) - len(prompt) + 3
        return want[k:k + 70] or [1]
    out, tokens = synthetic_run(drafter, prompt, rounds, truth)
    return out, drafter


def test_edit_memory_applies_the_longest_edit_and_never_splits_a_replacement():
    mem = EditMemory()
    assert mem.learn([5, 6], [9]) and mem.learn([5], [8, 8]) and not mem.learn([5], [5])
    assert not mem.learn([], [1]) and not mem.learn([1] * (MAX_SPAN + 1), [2])
    copy = mem.apply([1, 5, 6, 2, 5, 3, 4], 1, 10, eos=set())
    assert copy.tokens == [9, 2, 8, 8, 3, 4]                # [5, 6] wins over [5] at position 1
    assert copy.spans[0] == (1, 3) and copy.spans[2] == copy.spans[3] == (4, 5)
    assert copy.edits == [((5, 6), (9,)), ((5,), (8, 8))]
    assert copy.source_after(6, 1) == (7, None)             # all accepted: after the last span
    assert copy.source_after(3, 1) == (4, ((5,), (8, 8)))   # rejected inside a replacement
    assert mem.apply([1, 5, 6, 2, 5, 3], 1, 2, set()).tokens == [9, 2]  # [8, 8] would not fit
    assert mem.apply([1, 2, 5, 3], 1, 9, eos={8}).tokens == [2]         # nor one with an EOS
    mem.forget(((5,), (8, 8)))
    assert mem.apply([5, 3], 0, 4, set()).tokens == [5, 3]


def test_a_renamed_name_is_learned_once_and_drafted_at_its_later_uses():
    doc = _source()
    want = _rewrite(doc)
    rounds, drafter = _run(doc, want)
    out = [t for r in rounds for t in r.committed]
    assert out[:len(want) - 3] == want[3:]                  # the edited text, exactly
    assert drafter.follower.memory.edits == {OLD: NEW}
    applied = [r for r in rounds if r.extras.get("edits")]
    assert applied and applied[0].extras["edits"] == [[list(OLD), list(NEW)]]
    # copies that apply the edit run through the later uses of the name
    assert any(r.accepted == len(r.draft) and r.accepted > 10 for r in applied)
    plain, _ = _run(doc, want, learn=False)
    n = next(i for i, r in enumerate(rounds) if sum(len(x.committed) for x in rounds[:i + 1])
             >= len(want) - 3) + 1
    m = next(i for i, r in enumerate(plain) if sum(len(x.committed) for x in plain[:i + 1])
             >= len(want) - 3) + 1
    assert n < m, (n, m)                                    # fewer rounds with the memory


def test_an_insertion_is_learned_with_the_tokens_before_it():
    doc = _source(uses=(40, 90, 150))
    want = _rewrite(doc, OLD, OLD + (555, 556))             # "name" -> "name: int"
    rounds, drafter = _run(doc, want)
    assert [t for r in rounds for t in r.committed][:len(want) - 3] == want[3:]
    assert drafter.follower.memory.edits == {OLD: OLD + (555, 556)}


def test_a_contradicted_edit_is_forgotten_and_output_stays_exact():
    doc = _source()
    want = _rewrite(doc)
    # the last use is NOT renamed (a different variable of the same name, say)
    last = max(i for i in range(len(doc)) if tuple(doc[i:i + 2]) == OLD)
    want = _rewrite(doc[:last]) + doc[last:]
    rounds, drafter = _run(doc, want)
    assert [t for r in rounds for t in r.committed][:len(want) - 3] == want[3:]
    assert OLD not in drafter.follower.memory.edits         # forgotten where it was wrong


def test_a_round_that_applied_an_edit_says_so_in_words():
    from specviz.trace import Round
    from specviz.viz.extras import describe_extras

    rnd = Round(index=3, start=40, drafter="adapld", draft=[777, 5], accepted=2,
                committed=[777, 5, 6], extras={"retrieval": "lexical", "source": "copy",
                                               "streak": 2, "edits": [[list(OLD), list(NEW)]]})
    words = describe_extras(rnd)
    assert "continuing the copy" in words and "1 learned edit applied" in words
