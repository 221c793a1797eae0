"""Verification rules: greedy chain/tree logic and the sampling rules leave p unchanged."""
import pytest
import torch
from scipy.stats import chisquare

from specviz.tree import TokenTree
from specviz.verify import greedy_chain, greedy_tree, sample_chain, sample_tree, warp_probs

V = 6


def _logits_with_argmax(argmaxes):
    logits = torch.zeros(len(argmaxes), 10)
    for i, a in enumerate(argmaxes):
        logits[i, a] = 5.0
    return logits


def test_greedy_chain_accepts_longest_agreeing_prefix():
    logits = _logits_with_argmax([3, 4, 5, 6])
    assert greedy_chain([3, 4, 9], logits) == (2, 5)      # mismatch at 3rd: target says 5
    assert greedy_chain([3, 4, 5], logits) == (3, 6)      # all accepted: bonus token 6
    assert greedy_chain([], logits[:1]) == (0, 3)          # no draft: plain decoding step


def test_greedy_tree_follows_target_argmax():
    # root children: 7 (node0), 3 (node1); node1 children: 9 (node2), 4 (node3); node3 child 5
    tree = TokenTree([7, 3, 9, 4, 5], [-1, -1, 1, 1, 3])
    rows = [3, 0, 4, 0, 5, 8]  # row 0 = root, row i+1 = node i
    path, nxt = greedy_tree(tree.tokens, tree.parents, _logits_with_argmax(rows))
    assert path == [1, 3, 4] and nxt == 8


def _empirical(fn, n, vocab):
    counts = torch.zeros(vocab)
    g = torch.Generator().manual_seed(123)
    for _ in range(n):
        counts[fn(g)] += 1
    return counts


def _assert_matches(counts, p, alpha=1e-3):
    """Chi-square goodness of fit (cells with expected >= 5); fails with prob. alpha if exact."""
    n = counts.sum()
    exp = p * n
    keep = exp >= 5
    obs = counts[keep].numpy()
    e = exp[keep].numpy()
    e = e * obs.sum() / e.sum()
    assert counts[~keep].sum() <= max(10, 0.01 * n)
    stat, pval = chisquare(obs, e)
    tv = 0.5 * float((counts / n - p).abs().sum())
    assert pval > alpha, f"distribution differs: p-value {pval:.2e}, TV {tv:.3f}"
    assert tv < 0.03


@pytest.mark.parametrize("draft_token", [0, 2, 5])
def test_sampling_deterministic_draft_keeps_p(draft_token):
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(2, V) * 1.5, -1)
    def first_token(g):
        a, tok = sample_chain([draft_token], p, None, g)
        return draft_token if a == 1 else tok
    counts = _empirical(first_token, 20000, V)
    _assert_matches(counts, p[0])


def test_sampling_with_q_keeps_p():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(2, V) * 1.5, -1)
    q = torch.softmax(torch.randn(1, V) * 1.5, -1)
    def first_token(g):
        x = int(torch.multinomial(q[0], 1, generator=g))  # the drafter samples its token from q
        a, tok = sample_chain([x], p, q, g)
        return x if a == 1 else tok
    _assert_matches(_empirical(first_token, 20000, V), p[0])


def test_sampling_tree_keeps_p():
    torch.manual_seed(2)
    p = torch.softmax(torch.randn(4, V) * 1.5, -1)
    tree = TokenTree([1, 4, 2], [-1, -1, -1])  # three deterministic children of the root
    def first_token(g):
        path, tok = sample_tree(tree.tokens, tree.parents, p, g)
        return tree.tokens[path[0]] if path else tok
    _assert_matches(_empirical(first_token, 20000, V), p[0])


def test_warp_probs_top_p_and_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = warp_probs(logits, 1.0, top_p=0.8)
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(warp_probs(logits, 1.0), torch.tensor([[0.5, 0.3, 0.15, 0.05]]), atol=1e-6)
    cold = warp_probs(logits, 0.1)
    assert cold[0, 0] > 0.99


def test_tree_buffers():
    tree = TokenTree.from_sequences([[5, 6, 7], [5, 6, 8], [9]], max_nodes=10)
    assert tree.tokens == [5, 6, 7, 8, 9] and tree.parents == [-1, 0, 1, 1, -1]
    assert tree.depths == [1, 2, 3, 3, 1]
    assert tree.path_to(3) == [0, 1, 3]
    m = tree.attention_mask(cache_len=2)
    assert m.shape == (1, 1, 6, 8)
    # node 3 (row 4) sees cache, root, nodes 0, 1 and itself, not node 2 or 4
    assert m[0, 0, 4].tolist() == [True, True, True, True, True, False, True, False]
    assert tree.position_ids(2).tolist() == [[2, 3, 4, 5, 5, 3]]
    assert len(TokenTree.from_sequences([[1, 2, 3], [4, 5]], max_nodes=4)) == 4
