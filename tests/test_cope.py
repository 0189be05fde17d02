"""CoPE (Golovneva et al. 2024): against x-transformers' CoPE, against first principles (token counts, causality,
content-dependent positions, gradients), and the selective k-back task it is meant to solve."""
import pytest
import torch

import posenc
from posenc.attention import causal_mask, explicit_attention
from posenc.functional import contextual_positions, cope_gates, cope_logits
from posenc.schemes.cope import CoPE, interpolate_logits
from posenc.tasks import BOS, IGNORE, BUILDERS, Task, make_task
from posenc.tasks.counting import CountingTask
from posenc.tasks.synthetic import N_SPECIAL
from conftest import small_model


def qk(B=2, H=3, T=11, D=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g, dtype=dtype) * 2 for _ in range(2))


def scheme(npos_max=6, n_heads=3, head_dim=8, n_layers=1, **kw):
    return CoPE(d_model=n_heads * head_dim, n_heads=n_heads, n_layers=n_layers, max_len=64, causal=True,
                npos_max=npos_max, **kw)


def ctx(T):
    return posenc.PositionContext(torch.arange(T), causal=True)


# -- x-transformers -------------------------------------------------------------------
def test_position_logits_equal_x_transformers_cope():
    """x-transformers' `CoPE(query, attn_logits)` (Appendix B's code) with the same q, k and table.

    It takes the gates from the logits it is given -- here q k^T / sqrt(d_h) with the future
    filled with -finfo.max, as its `Attend` does -- and adds q . e(p) *unscaled*; ours scales
    the position term by 1/sqrt(d_h) (eq. 6, the authors' repository), so its table is ours
    times sqrt(d_h). Equal parts: gates, prefix sum, clamp at max_pos - 1 (T = 11 > 6 here:
    the clamp is exercised), interpolation. Not compared: its options (soft one-hot
    positions, talking heads) and gates taken after other biases (ALiBi etc.), which
    `posenc` keeps apart.
    """
    from x_transformers.x_transformers import CoPE as XCoPE
    q, k = qk()
    D, P = q.shape[-1], 6
    ref = XCoPE(dim=D, heads=3, max_pos=P)
    with torch.no_grad():
        ref.pos_emb.normal_()
    sim = (q @ k.transpose(-1, -2)) * D ** -0.5
    sim = sim.masked_fill(torch.ones(11, 11, dtype=torch.bool).triu(1), -torch.finfo(sim.dtype).max)
    expected = ref(q, sim)                                                    # (B, H, T, T)
    ours = scheme(npos_max=P)
    with torch.no_grad():
        ours.table[0, 0] = ref.pos_emb * D ** 0.5
    got = ours.extra_logits(q, k, ctx(11), 0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cope_logits(q, k, ref.pos_emb, 1.0, gates=cope_gates(q, k, D ** -0.5)), expected,
                               rtol=1e-5, atol=1e-5)                          # unscaled term: the same numbers


def test_attention_output_equals_x_transformers_attend_with_cope():
    """The whole softmax: x-transformers' `Attend(causal=True, cope=...)` against ours (explicit path)."""
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import CoPE as XCoPE
    q, k = qk(T=9, seed=1)
    v = torch.randn_like(q)
    D = q.shape[-1]
    cope_ref = XCoPE(dim=D, heads=3, max_pos=5)
    with torch.no_grad():
        cope_ref.pos_emb.normal_()
    expected, _ = Attend(causal=True, cope=cope_ref)(q, k, v)
    ours = scheme(npos_max=5)
    with torch.no_grad():
        ours.table[0, 0] = cope_ref.pos_emb * D ** 0.5
    mask = causal_mask(9, 9) + ours.extra_logits(q, k, ctx(9), 0)
    got, _ = explicit_attention(q, k, v, mask, ours.logit_scale())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# -- first principles -----------------------------------------------------------------
def token_count_logits(q, table, scale):
    """The explicit relative lookup: scale * q_i . e[min(i - j + 1, P - 1)] for j <= i (a [T, T, d] tensor)."""
    T, P = q.shape[-2], table.shape[-2]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    ids = (i - j + 1).clamp(0, P - 1).masked_fill(j > i, 0)                  # (T, T); future: p = 0
    return torch.einsum("bhid,ijd->bhij", q, table[ids]) * scale


def test_gates_of_one_count_tokens_exactly():
    """All gates 1: p_ij = i - j + 1, and CoPE is a relative scheme on token counts."""
    q, k = qk()
    ones = torch.ones(11, 11).tril().expand(2, 3, 11, 11)
    p = contextual_positions(ones)
    i, j = torch.arange(11)[:, None], torch.arange(11)[None, :]
    assert torch.equal(p[0, 0], (i - j + 1).clamp(min=0).float().masked_fill(j > i, 0))
    table = torch.randn(6, 8)
    torch.testing.assert_close(cope_logits(q, k, table, 0.3, gates=ones), token_count_logits(q, table, 0.3))


def test_huge_q_dot_k_saturates_every_gate_to_one():
    """The same without a hook: q = k = 10 u (q . k / sqrt(d) = 100 * sqrt(d)) gives sigmoid = 1.0 exactly."""
    u = torch.randn(8)
    q = (10 * u / u.norm()).expand(1, 2, 13, 8)
    table = torch.randn(2, 7, 8)                                              # per head
    got = cope_logits(q, q, table, 8 ** -0.5)
    assert torch.equal(cope_gates(q, q, 8 ** -0.5), torch.ones(13, 13).tril().expand(1, 2, 13, 13))
    expected = torch.stack([token_count_logits(q[:, h:h + 1], table[h], 8 ** -0.5)[:, 0] for h in range(2)], 1)
    torch.testing.assert_close(got, expected)


class _TokenCountCoPE(CoPE):
    """CoPE with every gate fixed to 1 (a test-only hook): it counts tokens."""

    def gates(self, q, k):
        return torch.ones(q.shape[-2], k.shape[-2]).tril().expand(*q.shape[:-1], k.shape[-2])


def test_cope_counting_tokens_is_shaw_on_the_keys(monkeypatch):
    """A whole model: CoPE with gates of 1 == Shaw et al. (keys only, k = P - 2) with the table laid out by distance."""
    monkeypatch.setitem(posenc.SCHEMES, "_token_cope", _TokenCountCoPE)
    P = 6
    torch.manual_seed(0)
    cope = small_model("_token_cope", npos_max=P)
    with torch.no_grad():
        cope.scheme.table.normal_()
    shaw = small_model("shaw", max_distance=P - 2, values=False)
    shaw.load_state_dict({n: t for n, t in cope.state_dict().items() if not n.startswith("scheme.")}, strict=False)
    K = P - 2
    rows = [min(1 - (r - K), P - 1) if r <= K else 0 for r in range(2 * K + 1)]  # row r <-> j - i = r - K
    with torch.no_grad():
        shaw.scheme.table_k.copy_(cope.scheme.table[:, 0, rows])
    tokens = torch.randint(0, 23, (3, 17))
    torch.testing.assert_close(cope(tokens), shaw(tokens), rtol=1e-5, atol=1e-5)


def test_positions_count_what_the_gates_select():
    """Keys +c u (marked) or -c u (not), query u: p_ij = number of marked keys in [j, i], whatever the distance."""
    u = torch.zeros(4)
    u[0] = 1.0
    marks = torch.tensor([[1, 0, 0, 1, 0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    k = torch.where(marks[..., None], 100 * u, -100 * u)[:, None]            # (2, 1, 10, 4)
    q = u.expand(2, 1, 10, 4)
    p = contextual_positions(cope_gates(q, k, 1.0))[:, 0]                     # (2, 10, 10)
    counts = marks.long().flip(-1).cumsum(-1).flip(-1)                       # marked keys at t >= j
    for b in range(2):
        for i in range(10):
            marked_between = counts[b, : i + 1] - counts[b, i + 1] if i < 9 else counts[b]
            torch.testing.assert_close(p[b, i, : i + 1], marked_between.float(), rtol=0, atol=1e-6)
    assert not torch.allclose(p[0], p[1])                                    # same length, other positions
    assert p[0, 9, 3].item() == pytest.approx(3.0) and p[1, 9, 3].item() == pytest.approx(7.0)  # keys 3, 5, 6 vs 3..9


def test_a_model_gives_the_same_key_different_positions_in_different_contexts():
    model = small_model("cope")
    x = model.tok(torch.tensor([[5, 7, 5, 7, 5], [5, 9, 9, 9, 5]]))
    q, k, _ = model.blocks[0].attn.qkv(model.blocks[0].ln1(x)).view(2, 5, 3, 4, 8).permute(2, 0, 3, 1, 4)
    p = model.scheme.positions(q, k)                                          # (2, H, 5, 5)
    assert not torch.allclose(p[0, :, 4, 0], p[1, :, 4, 0])                   # key 0 seen from query 4
    assert ((p[:, :, 4, 0] > 0) & (p[:, :, 4, 0] <= 5)).all()


def test_no_causal_leak():
    q, k = qk(T=12)
    table = torch.randn(3, 6, 8)
    changed = k.clone()
    changed[:, :, 8:] = torch.randn(2, 3, 4, 8)                               # keys after query 7
    a, b = cope_logits(q, k, table, 0.35), cope_logits(q, changed, table, 0.35)
    torch.testing.assert_close(a[:, :, :8], b[:, :, :8], rtol=0, atol=0)
    model = small_model("cope")
    with torch.no_grad():
        model.scheme.table.normal_()
    tokens = torch.randint(0, 23, (2, 20))
    later = tokens.clone()
    later[:, 12:] = torch.randint(0, 23, (2, 8))
    torch.testing.assert_close(model(tokens)[:, :12], model(later)[:, :12])
    assert not torch.allclose(model(tokens)[:, 12:], model(later)[:, 12:])


def test_gradients_reach_the_table_and_the_q_k_projections():
    q, k = qk(dtype=torch.float64, T=6, B=1, H=2, D=4)
    table = torch.randn(5, 4, dtype=torch.float64)
    # k enters CoPE only through the gates: its gradient is the gates' and the interpolation weight's
    for t in (q, k, table):
        t.requires_grad_(True)
    cope_logits(q, k, table, 0.5).square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, table))
    assert torch.autograd.gradcheck(lambda a, b, e: cope_logits(a, b, e, 0.5), (q, k, table))
    model = small_model("cope").train()
    with torch.no_grad():
        model.scheme.table.normal_()
    model(torch.randint(0, 23, (2, 9))).logsumexp(-1).mean().backward()
    assert model.scheme.table.grad.abs().sum() > 0
    qk_grad = model.blocks[0].attn.qkv.weight.grad[: 2 * 32]                  # rows of W_q and W_k
    assert torch.isfinite(qk_grad).all() and qk_grad.abs().sum() > 0


@pytest.mark.parametrize("per_head", [False, True])
def test_one_token_and_the_table_shapes(per_head):
    model = small_model("cope", per_head=per_head, npos_max=4)
    assert model.scheme.table.shape == (2, 4 if per_head else 1, 4, 8)
    assert model(torch.randint(0, 23, (3, 1))).shape == (3, 1, 23)
    q, k = qk(T=1)
    assert cope_logits(q, k, torch.randn(4, 8), 1.0).shape == (2, 3, 1, 1)
    assert torch.equal(contextual_positions(cope_gates(q, k, 1.0)), cope_gates(q, k, 1.0))   # p_00 = g_00


def test_per_head_tables_that_agree_equal_the_shared_table():
    q, k = qk()
    shared, per_head = scheme(), scheme(per_head=True)
    with torch.no_grad():
        shared.table.normal_()
        per_head.table.copy_(shared.table.expand_as(per_head.table))
    torch.testing.assert_close(per_head.extra_logits(q, k, ctx(11), 0), shared.extra_logits(q, k, ctx(11), 0))


def test_interpolation_is_linear_between_integer_positions_and_clamped():
    z = torch.tensor([[0.0, 10.0, 30.0]])                                    # z[p] for p = 0, 1, 2
    p = torch.tensor([[0.0, 0.25, 1.0, 1.5, 2.0, 7.0]])
    assert interpolate_logits(z, p).tolist() == [[0.0, 2.5, 10.0, 20.0, 30.0, 30.0]]


def test_cope_is_registered_causal_only_and_ignores_the_position_ids():
    assert posenc.SCHEMES["cope"] is CoPE and CoPE.causal_only and CoPE.shift_invariant
    model = small_model("cope")
    with torch.no_grad():
        model.scheme.table.normal_()
    tokens = torch.randint(0, 23, (2, 7))
    torch.testing.assert_close(model(tokens, torch.arange(7) * 3 + 100), model(tokens))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(tokens).float()).all()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"npos_max": 1}, ValueError, "npos_max must be an int >= 2"),
    ({"npos_max": 8.0}, ValueError, "npos_max"),
    ({"npos_max": True}, ValueError, "npos_max"),
    ({"per_head": 1}, TypeError, "per_head must be True or False"),
    ({"causal": False}, ValueError, "cope needs causal=True"),
])
def test_bad_options_are_rejected_by_name(kwargs, error, match):
    kwargs = {"causal": True, **kwargs}
    with pytest.raises(error, match=match):
        posenc.build_model("cope", 10, **kwargs)


def test_bad_tensors_are_rejected_by_name():
    q, k = qk()
    with pytest.raises(ValueError, match="table must be"):
        cope_logits(q, k, torch.randn(6, 5), 1.0)
    with pytest.raises(ValueError, match="q and k must be"):
        cope_gates(q, k[..., :4], 1.0)
    with pytest.raises(ValueError, match="q must not have more positions than k"):
        cope_gates(q, k[:, :, :3], 1.0)
    table = torch.randn(6, q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    with pytest.raises(ValueError, match=rf"gates must be a tensor \[\.\.\., Q={n_q}, K={n_k}\]"):
        cope_logits(q, k, table, 1.0, gates=torch.rand(n_q - 1, n_k - 1))     # would score only the first queries
    with pytest.raises(ValueError, match="gates must be"):
        cope_logits(q, k, table, 1.0, gates=[[1.0]])
    with pytest.raises(ValueError, match="npos >= 1"):
        cope_logits(q, k, table[:0], 1.0)
    with pytest.raises(TypeError, match="scale must be a number"):
        cope_logits(q, k, table, "x")


# -- the selective k-back task --------------------------------------------------------------
def reference_labels(items, k, n_symbols):
    """Label i: the marked item k marked items before the latest one at or before i (a loop)."""
    out = []
    for row in items.tolist():
        seen, labels = [], []
        for x in row:
            if x < N_SPECIAL + n_symbols:
                seen.append(x)
            labels.append(seen[-1 - k] if len(seen) > k else IGNORE)
        out.append(labels)
    return torch.tensor(out)


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("n", [4, 16, 64])
def test_counting_labels_are_the_kth_marked_item_back(k, n):
    task = CountingTask(k=k, min_train_length=max(4, k + 1))
    x, y = task.batch(64, n, torch.Generator().manual_seed(n), causal=True)
    assert x.shape == y.shape == (64, task.seq_len(n, True))
    assert (x[:, 0] == BOS).all() and (y[:, 0] == IGNORE).all()
    assert 0 <= x.min() and x.max() < task.vocab_size
    assert torch.equal(y[:, 1:], reference_labels(x[:, 1:], k, task.n_symbols))
    assert ((y != IGNORE).sum(1) > 0).all()                                   # every sample asks something


def test_counting_dilutes_the_marks_beyond_the_training_length():
    dense, diluted = CountingTask(), CountingTask(dilute=True)
    g = torch.Generator().manual_seed(0)
    rate = {n: (diluted.batch(512, n, g, True)[0][:, 1:] < N_SPECIAL + 8).float().mean().item() for n in (16, 64)}
    assert diluted.mark_rate(16) == dense.mark_rate(64) == 0.3 and diluted.mark_rate(64) == pytest.approx(0.075)
    assert rate[16] == pytest.approx(0.3, abs=0.02) and rate[64] == pytest.approx(0.075, abs=0.01)


def test_counting_task_is_registered_and_follows_the_protocol():
    task = make_task("counting")
    assert BUILDERS["counting"] is CountingTask and isinstance(task, Task)
    lengths = {task.train_batch(2, torch.Generator().manual_seed(s), True)[0].shape[1] for s in range(200)}
    assert lengths == {n + 1 for n in range(task.min_train_length, task.train_length + 1)}
    out = task.evaluate(small_model("cope", vocab=task.vocab_size), 32, n_samples=8)
    assert set(out) == {"accuracy", "seq_accuracy"} and 0 <= out["accuracy"] <= 1


def test_counting_oracle_scores_one():
    task = CountingTask(k=1)

    class Oracle(torch.nn.Module):
        causal = True

        def forward(self, tokens):
            labels = reference_labels(tokens[:, 1:], 1, task.n_symbols).clamp(min=0)
            logits = torch.zeros(*tokens.shape, task.vocab_size)
            logits[:, 1:].scatter_(-1, labels[..., None], 1.0)
            return logits

    assert task.evaluate(Oracle(), 40, n_samples=16) == {"accuracy": 1.0, "seq_accuracy": 1.0}


@pytest.mark.parametrize("kwargs, error, match", [
    ({"k": -1}, ValueError, "k must be >= 0"),
    ({"k": 4}, ValueError, "need k < min_train_length"),
    ({"mark_prob": 0.0}, ValueError, "mark_prob must be a number in"),
    ({"mark_prob": 1.5}, ValueError, "mark_prob"),
    ({"dilute": 1}, TypeError, "dilute must be True or False"),
    ({"n_symbols": 2.0}, TypeError, "n_symbols must be an int"),
    ({"train_length": 0}, ValueError, "train_length must be >= 1"),
])
def test_bad_counting_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        CountingTask(**kwargs)


def test_bad_counting_lengths():
    task = CountingTask(k=1, train_length=8)
    with pytest.raises(ValueError, match=r"length must be in \[2, 32\]"):
        task.batch(2, 33, torch.Generator(), True)
    with pytest.raises(ValueError, match="mark_prob=0.001 is too small"):
        CountingTask(k=3, mark_prob=0.001).batch(2, 4, torch.Generator(), True)


def test_cope_logits_refuse_integer_inputs_rather_than_truncate_them():
    """Integer q and k gave int64 logits ([2, 4, 6, 6]: the float result cast back to q's dtype)."""
    from posenc.schemes.cope import cope_logits
    q, table = torch.randint(0, 3, (1, 1, 4, 8)), torch.randn(5, 8)
    for args, name in (((q, q.float(), table), "q"), ((q.float(), q, table), "k"),
                       ((q.float(), q.float(), table.long()), "table")):
        with pytest.raises(TypeError, match=f"{name} must be a floating-point tensor; got torch.int64"):
            cope_logits(*args, 0.35)
    assert cope_logits(q.float(), q.float(), table, 0.35).dtype == torch.float32


def test_a_nan_in_q_or_k_gives_nan_logits_not_an_index_error():
    """NaN gates made NaN positions, and NaN.long() an index of -2^63 ("index ... is out of bounds")."""
    from posenc.schemes.cope import cope_logits, interpolate_logits
    torch.manual_seed(0)
    q, k, table = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(5, 8)
    k[0, 0, 1, 3] = float("nan")
    out = cope_logits(q, k, table, 0.35)
    assert out.isnan().any() and out.shape == (1, 1, 4, 4)
    z, p = torch.randn(2, 5), torch.tensor([[0.5, float("nan")], [1.25, 3.0]])
    got = interpolate_logits(z, p)
    assert got[0, 1].isnan() and not got[0, 0].isnan()
    torch.testing.assert_close(got[1], torch.stack([0.75 * z[1, 1] + 0.25 * z[1, 2], z[1, 3]]))
