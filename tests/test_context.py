"""The drafters' context cache (specviz.drafters.dflash.context): in-place appends into buffers with
spare room must hold exactly what concatenating every round's rows would hold."""
import random

import torch

from specviz.drafters.dflash.context import ContextCache


def test_appends_and_crops_match_concatenation():
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    cache = ContextCache(seq_dim=2)
    ref = [torch.zeros(1, 3, 0, 4), torch.zeros(1, 3, 0, 4)]
    for _ in range(200):
        if rng.random() < 0.3 and len(cache):
            n = rng.randrange(len(cache) + 1)
            cache.crop(n)
            ref = [r[:, :, :n] for r in ref]
        else:
            t = rng.choice([1, 1, 2, 3, 40])
            new = [torch.randn(1, 3, t, 4, generator=g) for _ in ref]
            cache.append(new)
            ref = [torch.cat([r, x], 2) for r, x in zip(ref, new)]
        assert len(cache) == ref[0].shape[2]
        assert all(torch.equal(a, b) for a, b in zip(cache.tensors, ref))
    assert cache.capacity >= len(cache)
    cache.reset()
    assert len(cache) == 0 and cache.tensors == []


def test_appending_few_rows_does_not_reallocate():
    cache = ContextCache(seq_dim=1)
    cache.append([torch.ones(2, 100)])
    store = cache._store[0]
    for i in range(cache.capacity - 100):
        cache.append([torch.full((2, 1), float(i))])
    assert cache._store[0] is store          # written in place while there is room
    cache.append([torch.zeros(2, 1)])
    assert cache._store[0] is not store and cache.capacity >= 2 * store.shape[1]
    assert torch.equal(cache.tensors[0][:, :100], torch.ones(2, 100))
