"""Complex-order embeddings (Wang et al. 2020): the derivation's claims, the layers, the task."""
import math
from collections import Counter, defaultdict

import pytest
import torch

import posenc
from posenc.absolute import sinusoidal_table
from posenc.complex_order import (ComplexAttention, ComplexLayerNorm, ComplexLinear, ComplexOrderEmbedding,
                                  ComplexOrderTransformer, complex_order_embedding, shared_frequencies, xavier_init_)
from posenc.rotary import apply_rope
from posenc.tasks.order import BUT, NOT, ContrastTask


def random_parameters(batch=3, seq=10, dim=8):
    r = torch.randn(batch, seq, dim, dtype=torch.float64)
    w = torch.rand(batch, seq, dim, dtype=torch.float64) * 3
    theta = torch.rand(batch, seq, dim, dtype=torch.float64) * 2 * math.pi
    return r, w, theta


def test_embedding_matches_naive_formula():
    r, w, theta = random_parameters(batch=2, seq=5, dim=3)
    pos = torch.tensor([0.0, 1.0, 7.0, 2.5, 40.0])
    f = complex_order_embedding(r, w, theta, pos)
    for b in range(2):
        for t in range(5):
            for k in range(3):
                expected = r[b, t, k].item() * complex(math.cos(w[b, t, k] * pos[t] + theta[b, t, k]),
                                                       math.sin(w[b, t, k] * pos[t] + theta[b, t, k]))
                assert abs(f[b, t, k].item() - expected) < 1e-9


@pytest.mark.parametrize("n", [1, 3, 17, 1000])
def test_offset_transform_is_position_free(n):
    """Property 1: f(j, pos + n) = T_n f(j, pos) with T_n = exp(i w_j n), the same for every pos."""
    r, w, theta = random_parameters()
    pos = torch.rand(10, dtype=torch.float64) * 100
    f, f_shift = (complex_order_embedding(r, w, theta, p) for p in (pos, pos + n))
    transform = torch.polar(torch.ones_like(w), w * n)                  # depends on the word and n, not pos
    assert torch.allclose(f_shift, transform * f, atol=1e-9)


def test_boundedness():
    """Property 2: |f(j, pos)| = |r_j| at every position, however large."""
    r, w, theta = random_parameters(seq=4)
    pos = torch.tensor([0.0, 1e3, 1e5, 1e7], dtype=torch.float64)
    assert torch.allclose(complex_order_embedding(r, w, theta, pos).abs(), r.abs(), atol=1e-9)


def test_real_and_imaginary_parts_are_the_sinusoidal_table():
    """r = 1, theta = 0, w = base^{-2k/d}: Re f = cos columns, Im f = sin columns of Vaswani's table."""
    n, d = 50, 16
    w = shared_frequencies(d // 2).double().expand(n, -1)
    f = complex_order_embedding(torch.ones_like(w), w, torch.zeros_like(w), torch.arange(n))
    table = sinusoidal_table(n, d)
    assert torch.allclose(f.real.float(), table[:, 1::2], atol=1e-5)
    assert torch.allclose(f.imag.float(), table[:, 0::2], atol=1e-5)


def scheme(word_frequencies, d=16):
    return posenc.SCHEMES["complex"](d_model=d, n_heads=2, n_layers=1, max_len=64, causal=False,
                                     word_frequencies=word_frequencies)


def context(positions):
    return posenc.PositionContext(positions, causal=False)


def test_scheme_with_shared_frequencies_is_rope_on_the_input():
    """Multiplying by exp(i w pos) is a rotation: the scheme equals RoPE applied to the embedding."""
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb
    x, pos = torch.randn(2, 12, 16), torch.arange(12)
    out = scheme(False).embed(x, context(pos))
    reference = apply_rotary_emb(RotaryEmbedding(16).forward(pos), x)   # rotary-embedding-torch, interleaved pairs
    assert torch.allclose(out, reference, atol=1e-5)
    assert torch.allclose(out, apply_rope(x, pos, layout="interleaved"), atol=1e-5)


def test_scheme_shared_frequencies_give_relative_dot_products():
    x = torch.randn(1, 9, 16)
    s = scheme(False)
    gram = [(lambda h: h @ h.transpose(-1, -2))(s.embed(x, context(torch.arange(9.0) + c))) for c in (0, 123)]
    assert torch.allclose(*gram, atol=1e-4)


def test_scheme_word_frequencies_keep_both_properties():
    s, x = scheme(True), torch.randn(2, 7, 16)
    with torch.no_grad():
        s.word_freq.weight.normal_()                                      # clearly word-dependent frequencies
    pos, n = torch.arange(7.0), 5
    z = [torch.view_as_complex(s.embed(x, context(p)).unflatten(-1, (-1, 2)).contiguous()) for p in (pos, pos + n)]
    w = s.frequencies(x)                                                  # (B, T, D/2), one row per word
    assert w.std(1).mean() > 0.1                                          # words do get different frequencies
    assert torch.allclose(z[1], torch.polar(torch.ones_like(w), w * n) * z[0], atol=1e-4)
    pairs = x.unflatten(-1, (-1, 2)).norm(dim=-1)
    assert torch.allclose(z[0].abs(), pairs, atol=1e-5) and torch.allclose(z[1].abs(), pairs, atol=1e-5)


def test_registered_and_builds():
    model = posenc.build_model("complex", 20, d_model=16, n_heads=2, n_layers=1, causal=False, max_len=32).eval()
    tokens = torch.randint(0, 20, (2, 8))
    assert model(tokens).shape == (2, 8, 20)
    assert not torch.allclose(model(tokens), model(tokens, torch.arange(8) + 3))   # absolute: shifts matter
    with pytest.raises(ValueError, match="d_model"):
        posenc.build_model("complex", 20, d_model=15, n_heads=3, causal=False)


def test_complex_linear_is_the_real_block_matrix():
    lin = ComplexLinear(5, 4)
    with torch.no_grad():
        lin.bias.normal_()
    x = torch.randn(3, 5, dtype=torch.cfloat)
    a, b = lin.weight[0], lin.weight[1]
    bias = torch.view_as_complex(lin.bias.view(-1, 2))
    block = torch.cat([torch.cat([a, -b], 1), torch.cat([b, a], 1)], 0)   # [[A, -B], [B, A]]
    y = torch.cat([x.real, x.imag], -1) @ block.T
    expected = torch.complex(y[:, :4], y[:, 4:]) + bias
    assert torch.allclose(lin(x), expected, atol=1e-5)


def test_complex_layer_norm_normalises():
    z = torch.randn(4, 6, 10, dtype=torch.cfloat) * 3 + 2
    out = ComplexLayerNorm(10)(z)
    assert torch.allclose(out.mean(-1), torch.zeros(4, 6, dtype=torch.cfloat), atol=1e-5)
    assert torch.allclose(out.abs().square().mean(-1), torch.ones(4, 6), atol=1e-3)


def test_real_score_is_the_real_dot_product_of_2x_views():
    attn = ComplexAttention(8, 2, score="real")
    q, k = torch.randn(2, 2, 5, 4, dtype=torch.cfloat), torch.randn(2, 2, 5, 4, dtype=torch.cfloat)
    real_q, real_k = torch.view_as_real(q).flatten(-2), torch.view_as_real(k).flatten(-2)
    expected = (real_q @ real_k.transpose(-1, -2) / 2).softmax(-1)
    assert torch.allclose(attn.weights(q, k), expected, atol=1e-5)


def test_modulus_score_is_the_modulus_of_the_hermitian_product_over_sqrt_dh():
    """softmax(|q k^H| / sqrt(d_h)): with the conjugate the phases of q and k subtract, so a common phase
    on both leaves the score; without it (the authors' released code, not implemented) they add."""
    torch.manual_seed(0)
    attn = ComplexAttention(8, 2, score="modulus")
    q, k = torch.randn(2, 2, 5, 4, dtype=torch.cfloat), torch.randn(2, 2, 5, 4, dtype=torch.cfloat)
    expected = ((q @ k.conj().transpose(-1, -2)).abs() / 2).softmax(-1)          # sqrt(d_h) = sqrt(4)
    assert torch.allclose(attn.weights(q, k), expected, atol=1e-6)
    no_conj = ((q @ k.transpose(-1, -2)).abs() / 2).softmax(-1)
    assert not torch.allclose(attn.weights(q, k), no_conj, atol=1e-3)
    rot = torch.polar(torch.tensor(1.0), torch.tensor(0.9))                      # one phase for every entry
    assert torch.allclose(attn.weights(q * rot, k * rot), attn.weights(q, k), atol=1e-5)


def test_modulus_attention_commutes_with_a_global_phase():
    attn = ComplexAttention(8, 2, score="modulus")
    z, phase = torch.randn(2, 6, 8, dtype=torch.cfloat), torch.polar(torch.tensor(1.0), torch.tensor(0.7))
    assert torch.allclose(attn(z * phase)[0], attn(z)[0] * phase, atol=1e-5)


def test_transformer_without_order_is_permutation_invariant():
    tokens, perm = torch.randint(0, 30, (3, 9)), torch.randperm(9)
    for order, invariant in ((False, True), (True, False)):
        torch.manual_seed(0)
        model = ComplexOrderTransformer(30, 2, d_model=8, n_heads=2, order=order).eval()
        same = torch.allclose(model.classify(tokens[:, perm]), model.classify(tokens), atol=1e-5)
        assert same == invariant
    assert model(tokens).shape == (3, 2) and len(model.attention_maps(tokens)) == 1


def test_embedding_module_initialised_like_sinusoidal():
    emb = ComplexOrderEmbedding(7, 4)
    f = emb(torch.tensor([[3, 3]]), torch.tensor([0, 5]))
    r = emb.amplitude.weight[3]
    assert torch.allclose(f[0, 1], r * torch.polar(torch.ones(4), 5 * shared_frequencies(4)), atol=1e-5)
    assert not ComplexOrderEmbedding(7, 4, order=False).frequency.weight.any()


def test_bad_arguments():
    with pytest.raises(ValueError, match="score"):
        ComplexAttention(8, 2, score="dot")
    with pytest.raises(ValueError, match="positions"):
        complex_order_embedding(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3), torch.arange(4))
    with pytest.raises(ValueError, match="d_model"):
        ComplexOrderTransformer(10, 2, d_model=0)
    with pytest.raises(ValueError, match="length"):
        ContrastTask(length=4)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="n_train"):
            ContrastTask(n_train=bad)
    with pytest.raises(ValueError, match="n_train"):
        ContrastTask().train_set()


def oracle(task, tokens):
    """The rule: polarity of the phrase after "but", flipped by a "not" right before its word."""
    labels = []
    for row in tokens.tolist():
        b = row.index(BUT)
        i = next(i for i in range(b + 1, len(row)) if 3 <= row[i] < 3 + 2 * task.n_sentiment)
        positive = row[i] < 3 + task.n_sentiment
        labels.append(int(positive) ^ int(row[i - 1] == NOT))
    return torch.tensor(labels)


def test_task_labels_follow_the_rule_and_order_alone_decides():
    task = ContrastTask(length=12)
    x, y = task.batch(4000, torch.Generator().manual_seed(0))
    assert x.shape == (4000, 12) and (x == BUT).sum(1).eq(1).all()
    assert torch.equal(oracle(task, x), y)
    # the best bag-of-words rule (majority label per multiset) is at chance on fresh data
    key = lambda row: tuple(sorted(t for t in row if t < 3 + 2 * task.n_sentiment))
    votes = defaultdict(Counter)
    for row, label in zip(x.tolist(), y.tolist()):
        votes[key(row)][label] += 1
    x2, y2 = task.batch(4000, torch.Generator().manual_seed(1))
    guess = [votes[key(row)].most_common(1)[0][0] if votes[key(row)] else 0 for row in x2.tolist()]
    assert abs((torch.tensor(guess) == y2).float().mean().item() - 0.5) < 0.04


def test_fixed_training_set_is_shared_sampled_and_unseen_at_evaluation():
    task = ContrastTask(length=12, n_train=64)
    x, y = task.train_set()
    assert x.shape == (64, 12) and torch.equal(oracle(task, x), y)
    assert torch.equal(ContrastTask(length=12, n_train=64).train_set()[0], x)      # the same set for every model
    seen = {tuple(row) for row in x.tolist()}
    for seed in (0, 1):                                     # every batch is drawn from the set, whatever the seed
        bx, by = task.train_batch(256, torch.Generator().manual_seed(seed))
        assert all(tuple(row) in seen for row in bx.tolist()) and torch.equal(oracle(task, bx), by)
    assert len({tuple(r) for r in bx.tolist()}) > 48                                # sampled across the set
    # the evaluation sentences (the held-out generator) are not training sentences
    ex, _ = task.batch(1000, torch.Generator().manual_seed(12345))
    assert not seen & {tuple(row) for row in ex.tolist()}
    # without n_train every batch is fresh: the same generator state gives what `batch` gives
    fresh = ContrastTask(length=12)
    assert torch.equal(fresh.train_batch(8, torch.Generator().manual_seed(3))[0],
                       fresh.batch(8, torch.Generator().manual_seed(3))[0])


def test_an_unset_optional_task_setting_stays_out_of_run_specs():
    from posenc.runs.spec import RunSpec
    from posenc.tasks import task_defaults
    assert "n_train" not in task_defaults("contrast")
    spec = lambda **kw: RunSpec(scheme="nope", task="contrast", task_kwargs={"length": 12, **kw}, recipe="classify")
    assert "n_train" not in spec().task_kwargs and spec(n_train=100).task_kwargs["n_train"] == 100
    assert spec().key != spec(n_train=100).key


def test_xavier_init_rescales_the_real_model():
    model = xavier_init_(posenc.build_model("sinusoidal", 20, d_model=16, n_heads=2, n_layers=1, causal=False,
                                            num_classes=2))
    assert 0.8 < model.tok.weight.std() < 1.2
    assert model.blocks[0].attn.qkv.weight.std() > 0.1


def test_phrases_can_sit_at_either_end_of_the_sentence():
    """The three gap boundaries are drawn from 0..n_fill, so the fillers before phrase A and after phrase B may be
    empty: over 2000 sentences some start with phrase A and some end with phrase B's sentiment word, at about
    the rate 1 - (n_fill / (n_fill + 1))^3 of a boundary landing on the end."""
    task = ContrastTask(length=12)
    x, y = task.batch(2000, torch.Generator().manual_seed(0))
    sentiment = lambda t: (3 <= t) & (t < 3 + 2 * task.n_sentiment)
    ends_with_b = sentiment(x[:, -1])
    starts_with_a = sentiment(x[:, 0]) | (x[:, 0] == NOT)
    assert ends_with_b.sum() > 100 and starts_with_a.sum() > 100
    # the last word, when a sentiment word, is phrase B's: it decides the label (with a "not" right before it)
    last = x[ends_with_b]
    positive = last[:, -1] < 3 + task.n_sentiment
    assert torch.equal((positive.long() ^ (last[:, -2] == NOT).long()), y[ends_with_b])
    # n_fill is 9, 8 or 7 (0, 1 or 2 "not"s): the end rate lies between those of n_fill = 9 and 7
    rate = ends_with_b.float().mean().item()
    assert 1 - (9 / 10) ** 3 - 0.04 < rate < 1 - (7 / 8) ** 3 + 0.04


def test_a_fixed_training_set_samples_every_sentence_including_the_last():
    """With n_train=2, a batch of 500 samples (with replacement) both training sentences, each about half the time."""
    task = ContrastTask(length=12, n_train=2)
    x, y = task.train_set()
    assert not torch.equal(x[0], x[1])
    bx, by = task.train_batch(500, torch.Generator().manual_seed(0))
    first = (bx == x[0]).all(1)
    second = (bx == x[1]).all(1)
    assert bool((first | second).all()) and 150 < int(second.sum()) < 350 and 150 < int(first.sum()) < 350
    assert torch.equal(by[first], y[0].expand(int(first.sum()))) and torch.equal(by[second],
                                                                                 y[1].expand(int(second.sum())))


def test_evaluate_classifies_in_eval_mode_and_restores_the_mode():
    """`evaluate` runs `classify` with the model in eval mode (no dropout) and hands it back in the mode it had:
    a training model stays in training, an evaluating one in evaluation."""

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.modes = torch.nn.Parameter(torch.zeros(1)), []

        def classify(self, x):
            self.modes.append(self.training)
            return torch.zeros(len(x), 2)

    task = ContrastTask(length=12)
    for training in (True, False):
        model = Recorder().train(training)
        task.evaluate(model, n_samples=16)
        assert model.modes == [False] and model.training is training
