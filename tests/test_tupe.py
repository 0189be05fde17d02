"""TUPE: untied logits with 1/sqrt(2d), the position term computed once per forward,
the [CLS] reset, the BERT-A^d ablation, TUPE-R's T5 bias; and the pre-training task."""
import math

import pytest
import torch

import posenc
from posenc.analysis import steps_to_reach
from posenc.tasks.pretraining import MaskedLMWithCLS, loss_parts, pretraining_loss
from posenc.tasks import CharCorpus
from posenc.tasks.synthetic import IGNORE
from posenc.tupe import TUPE, cls_reset, four_terms

from conftest import small_model


def _layer0(model, tokens):
    """Content q, k of layer 0 ([B, H, N, dh]) and p U_Q, p U_K ([H, N, dh]) by hand."""
    s, B = model.scheme, tokens.shape[0]
    x = model.tok(tokens)
    if model.cls is not None:
        x = torch.cat([model.cls.expand(B, -1, -1), x], 1)
    N = x.shape[1]
    q, k, _ = model.blocks[0].attn.qkv(model.blocks[0].ln1(x)).view(B, N, 3, s.n_heads, s.head_dim).permute(2, 0, 3, 1, 4)
    p = s.pos.weight[:N]
    return q, k, s.heads(s.u_q(p)), s.heads(s.u_k(p))


def test_tupe_a_logits_are_untied_with_sqrt_2d():
    model = small_model("tupe", causal=False, cls_token=True)
    theta = torch.randn(2, model.scheme.n_heads)                               # one (theta_1, theta_2) per head
    with torch.no_grad():
        model.scheme.theta.copy_(theta)
    tokens = torch.randint(0, 23, (2, 9))
    q, k, pq, pk = _layer0(model, tokens)
    d = model.scheme.head_dim
    pos = pq @ pk.transpose(-2, -1) / math.sqrt(2 * d)                          # (H, N, N), paper Eq. 7
    for h in range(model.scheme.n_heads):                                      # paper Eq. 9, head by head
        pos[h, 0, :], pos[h, 1:, 0] = theta[0, h], theta[1, h]
    want = (q @ k.transpose(-2, -1) / math.sqrt(2 * d) + pos).softmax(-1)
    torch.testing.assert_close(model.attention_maps(tokens)[0], want)


def test_cls_reset_replaces_exactly_row_and_column_of_cls():
    v = torch.randn(3, 7, 7)
    out = cls_reset(v, torch.tensor(2.0), torch.tensor(-5.0))
    assert torch.all(out[:, 0, :] == 2.0) and torch.all(out[:, 1:, 0] == -5.0)
    assert torch.equal(out[:, 1:, 1:], v[:, 1:, 1:])
    t1, t2 = torch.randn(3), torch.randn(3)                                    # one pair per head
    out = cls_reset(torch.randn(2, 3, 7, 7), t1, t2)
    assert torch.equal(out[:, :, 0, :], t1[:, None].expand(3, 7).expand(2, 3, 7))
    assert torch.equal(out[:, :, 1:, 0], t2[:, None].expand(3, 6).expand(2, 3, 6))
    with pytest.raises(ValueError, match="one theta per head"):
        cls_reset(torch.randn(4, 7, 7), t1, t2)
    with pytest.raises(ValueError, match="theta1 and theta2"):
        cls_reset(v, t1, torch.tensor(1.0))
    # and inside the model: with and without reset the tables differ only there
    a = small_model("tupe", causal=False, cls_token=True)
    b = small_model("tupe", causal=False, cls_token=True, cls_reset=False)
    b.load_state_dict(a.state_dict())
    ta, tb = a.context(8, None, "cpu").attn_mask, b.context(8, None, "cpu").attn_mask
    diff = (ta != tb).any(0)                                                    # (N, N)
    mask = torch.zeros(9, 9, dtype=torch.bool)
    mask[0, :], mask[:, 0] = True, True
    assert torch.equal(diff, mask)


def test_reset_needs_a_cls_token():
    model = small_model("tupe", causal=False)                                  # no [CLS]: nothing reset
    s, ctx = model.scheme, model.context(6, None, "cpu")
    torch.testing.assert_close(ctx.attn_mask, s.position_term(ctx)[0])


def test_position_term_computed_once_per_forward_and_shared():
    model = small_model("tupe", causal=False, cls_token=True, n_layers=3)
    calls = []
    model.scheme.u_q.register_forward_hook(lambda *a: calls.append(1))
    seen = []
    model.scheme.logit_bias = lambda ctx, f=model.scheme.logit_bias: seen.append(f(ctx)) or seen[-1]
    model(torch.randint(0, 23, (2, 8)))
    assert len(calls) == 1 and len(seen) == 1                                   # U_Q p once, bias built once
    assert model.scheme.custom_attention is True                                # extra_logits exists (BERT-A^d)


def test_bert_separate_projections_keeps_all_four_terms():
    model = small_model("tupe", causal=False, cls_token=True, cross_terms=True, cls_reset=False)
    tokens = torch.randint(0, 23, (2, 7))
    q, k, pq, pk = _layer0(model, tokens)
    d = model.scheme.head_dim
    assert model.scheme.logit_scale() == pytest.approx(1 / math.sqrt(4 * d))   # four terms: 1/sqrt(4d)
    want = ((q + pq) @ (k + pk).transpose(-2, -1) / math.sqrt(4 * d)).softmax(-1)
    torch.testing.assert_close(model.attention_maps(tokens)[0], want)


def test_four_terms_sum_to_the_tied_logits():
    x, p, wq, wk = torch.randn(6, 16), torch.randn(6, 16), torch.randn(16, 4), torch.randn(16, 4)
    terms = four_terms(x, p, wq, wk, 0.5)
    torch.testing.assert_close(sum(terms.values()), ((x + p) @ wq) @ ((x + p) @ wk).T * 0.5)
    # each term by name: the query's source first, the key's second (paper Eq. 6)
    for name, (a, b) in {"word-word": (x, x), "word-position": (x, p), "position-word": (p, x),
                         "position-position": (p, p)}.items():
        torch.testing.assert_close(terms[name], (a @ wq) @ (b @ wk).T * 0.5)
    assert not torch.allclose(terms["word-position"], terms["position-word"])
    no_words = four_terms(torch.zeros_like(x), p, wq, wk, 0.5)               # only the position-only term is left
    assert all(not no_words[n].any() for n in ("word-word", "word-position", "position-word"))
    assert no_words["position-position"].abs().max() > 0


def test_tupe_r_adds_the_t5_bias():
    from posenc import bias                                                     # a broken alias fails, not skips
    a = small_model("tupe", causal=False, cls_token=True, relative=True, num_buckets=8, max_distance=16)
    b = small_model("tupe", causal=False, cls_token=True)
    b.load_state_dict({k: v for k, v in a.state_dict().items() if not k.startswith("scheme.rel_bias")})
    N = 10
    ctx_a, ctx_b = a.context(N - 1, None, "cpu"), b.context(N - 1, None, "cpu")
    rel = torch.arange(N)[None, :] - torch.arange(N)[:, None]                   # j - i
    want = ctx_b.attn_mask + a.scheme.rel_bias(bias.t5_bucket(rel, True, 8, 16)).permute(2, 0, 1)
    torch.testing.assert_close(ctx_a.attn_mask[:, 1:, 1:], want[:, 1:, 1:])     # [CLS] row/col: reset
    torch.testing.assert_close(ctx_a.attn_mask[:, 0], ctx_b.attn_mask[:, 0])


def test_bad_arguments():
    with pytest.raises(TypeError, match="relative"):
        small_model("tupe", causal=False, relative="yes")
    with pytest.raises(ValueError, match="max_len"):
        small_model("tupe", causal=False, max_len=8)(torch.zeros(1, 4, dtype=torch.long), torch.arange(4) + 10)
    assert isinstance(small_model("tupe", causal=False).scheme, TUPE) and "tupe" in posenc.SCHEMES


# -- the pre-training task ---------------------------------------------------------
@pytest.fixture(scope="module")
def task():
    text = "\f".join(f"document {i}: " + "abcdefghij" * 30 for i in range(20))
    return MaskedLMWithCLS(CharCorpus(text, train_length=16))


def test_batches_carry_label_and_masked_targets(task):
    x, y = task.train_batch(64, torch.Generator().manual_seed(0), causal=False)
    assert x.shape == (64, 16) and y.shape == (64, 17)
    assert set(y[:, 0].tolist()) == {0, 1}
    masked = y[:, 1:] != IGNORE
    assert torch.all(x[masked] == 1) and 0.05 < masked.float().mean() < 0.3


def test_label_one_means_continuation():
    text = "\f".join("".join(chr(65 + (i + j) % 26) for j in range(400)) for i in range(12))   # ABC...: next = +1
    t = MaskedLMWithCLS(CharCorpus(text, train_length=16, mask_prob=0.0))
    x, y = t.train_batch(200, torch.Generator().manual_seed(1))
    step = (x[:, 8] - x[:, 7]) % 26                                            # across the half boundary
    assert (step[y[:, 0] == 1] == 1).float().mean() > 0.95                      # (a few windows cross a \f)
    assert (step[y[:, 0] == 0] != 1).float().mean() > 0.8


def test_noise_tail_label_marks_a_replaced_tail():
    text = _consecutive_text()
    t = MaskedLMWithCLS(CharCorpus(text, train_length=16, mask_prob=0.5), cls_task="noise_tail")
    x, y = t.train_batch(300, torch.Generator().manual_seed(2))
    clean = x.clone()
    clean[y[:, 1:] != IGNORE] = y[:, 1:][y[:, 1:] != IGNORE]                   # undo the masking
    intact, noisy = y[:, 0] == 1, y[:, 0] == 0
    assert 0.35 < intact.float().mean() < 0.65
    step = (clean[:, 13:] - clean[:, 12:15]) % 26                              # the tail: the last 16 / 4 = 4
    assert (step[intact] == 1).float().mean() > 0.95
    assert (step[noisy] != 1).float().mean() > 0.8
    assert torch.all(y[noisy, 13:] == IGNORE)                                  # noise is never an MLM target
    assert (y[intact, 13:] != IGNORE).float().mean() > 0.3
    assert torch.all(x[noisy, 12:] != 0)                                       # noise never draws UNK
    with pytest.raises(ValueError, match="cls_task"):
        MaskedLMWithCLS(CharCorpus(text, train_length=16), cls_task="order")


def test_loss_runs_and_backpropagates(task):
    model = posenc.build_model("tupe", task.vocab_size, causal=False, cls_token=True, num_classes=2,
                               d_model=32, n_heads=4, max_len=16)
    x, y = task.train_batch(4, torch.Generator().manual_seed(0))
    loss = pretraining_loss(model, x, y)
    loss.backward()
    parts = loss_parts(model, x, y)
    assert torch.isfinite(loss) and loss.item() == pytest.approx((parts["mlm"] + parts["cls"]).item())
    assert model.scheme.theta.grad is not None and model.scheme.theta.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="causal"):
        task.train_batch(4, torch.Generator(), causal=True)
    with pytest.raises(ValueError, match="cls_token"):
        loss_parts(small_model("tupe", causal=False, vocab=task.vocab_size), x, y)


def test_steps_to_reach():
    hist = [{"step": s, "loss": l} for s, l in zip((10, 20, 30, 40), (4.0, 3.0, 2.0, 1.0))]
    assert steps_to_reach(hist, 2.5, window=1) == 30
    assert steps_to_reach(hist, 2.0, window=2) == 40                           # smoothed: 2.5 at 30, 1.5 at 40
    assert steps_to_reach(hist, 0.5) == math.inf


def test_bert_first_layer_terms_sum_to_the_first_layer_logits():
    from posenc.tupe import bert_first_layer_terms
    torch.manual_seed(0)
    model = posenc.build_model("learned", 30, causal=False, cls_token=True, num_classes=2, d_model=32, n_heads=4,
                               max_len=16)
    ids = torch.randint(0, 30, (10,))
    terms = bert_first_layer_terms(model, ids, head=1, layer_norm=False)      # the paper's Eq. 6: raw embeddings
    x = model.tok(ids) + model.scheme.table[1:11]                               # word + position, as BERT's input
    q, k, _ = model.blocks[0].attn.qkv(x).detach().split(32, -1)
    want = q[:, 8:16] @ k[:, 8:16].T / math.sqrt(8)                             # head 1 of 4, d_h = 8
    torch.testing.assert_close(sum(terms.values()), want)
    qw, kw = model.blocks[0].attn.qkv(model.tok(ids)).detach().split(32, -1)[:2]       # words alone
    qp, kp = model.blocks[0].attn.qkv(model.scheme.table[1:11]).detach().split(32, -1)[:2]   # positions alone
    h = slice(8, 16)
    torch.testing.assert_close(terms["word-position"], qw[:, h] @ kp[:, h].T / math.sqrt(8))
    torch.testing.assert_close(terms["position-word"], qp[:, h] @ kw[:, h].T / math.sqrt(8))
    torch.testing.assert_close(terms["position-position"], qp[:, h] @ kp[:, h].T / math.sqrt(8))
    with pytest.raises(ValueError, match="head"):
        bert_first_layer_terms(model, ids, head=4)
    with pytest.raises(TypeError, match="layer_norm"):
        bert_first_layer_terms(model, ids, layer_norm="yes")
    with pytest.raises(ValueError, match="learned"):
        bert_first_layer_terms(small_model("tupe", causal=False), ids)


def test_bert_first_layer_terms_through_the_layer_norm_sum_to_the_logits_the_model_computes():
    """With layer_norm (the default) the four terms and the norm's shift add up to the logits of the first
    block's head as the model computes them (captured at its LayerNorm, gain and shift trained away from 1
    and 0); the terms are those of the centred embeddings, divided by the sum's per-token deviation."""
    from posenc.tupe import bert_first_layer_terms
    torch.manual_seed(0)
    model = posenc.build_model("learned", 30, causal=False, cls_token=True, d_model=32, n_heads=4, max_len=16)
    with torch.no_grad():
        model.blocks[0].ln1.weight.uniform_(0.5, 2.0)
        model.blocks[0].ln1.bias.normal_(0, 0.5)
    ids = torch.randint(0, 30, (10,))
    seen = {}
    handle = model.blocks[0].ln1.register_forward_hook(lambda mod, inp, out: seen.setdefault("z", out.detach()))
    model.eval()
    model(ids[None])
    handle.remove()
    z = seen["z"][0, 1:]                                                        # (10, 32): [CLS] left out
    q, k, _ = model.blocks[0].attn.qkv(z).detach().split(32, -1)
    want = q[:, 8:16] @ k[:, 8:16].T / math.sqrt(8)                             # head 1 of 4
    terms = bert_first_layer_terms(model, ids, head=1)
    assert set(terms) == {"word-word", "word-position", "position-word", "position-position", "layer-norm shift"}
    torch.testing.assert_close(sum(terms.values()), want, rtol=1e-5, atol=1e-5)
    x, p = model.tok(ids).detach(), model.scheme.table[1:11].detach()
    sigma = ((x + p).var(-1, unbiased=False, keepdim=True) + model.blocks[0].ln1.eps).sqrt()   # LayerNorm's eps
    xn = model.blocks[0].ln1.weight.detach() * (x - x.mean(-1, keepdim=True)) / sigma
    qx = model.blocks[0].attn.qkv(xn).detach()[:, 8:16]
    kx = model.blocks[0].attn.qkv(xn).detach()[:, 40:48]
    torch.testing.assert_close(terms["word-word"], qx @ kx.T / math.sqrt(8), rtol=1e-4, atol=1e-5)
    assert terms["layer-norm shift"].abs().max() > 0.01                          # the shift is not dropped


def test_noise_tail_replaces_exactly_the_last_quarter():
    """cls_task="noise_tail": a swapped window has exactly its last L/4 characters replaced, and only they leave
    the MLM targets. With every character masked (mask_prob=1) and every window swapped (swap_prob=1), L=16:
    each row's targets are the 12 first characters, then 4 IGNOREs, and every label is 0."""
    text = "\f".join("".join(chr(65 + (i + j) % 26) for j in range(400)) for i in range(12))
    t = MaskedLMWithCLS(CharCorpus(text, train_length=16, mask_prob=1.0), swap_prob=1.0, cls_task="noise_tail")
    x, y = t.train_batch(64, torch.Generator().manual_seed(0))
    assert (y[:, 0] == 0).all() and (x == 1).all()
    assert (y[:, 1:13] != IGNORE).all() and (y[:, 13:] == IGNORE).all()
    # unmasked, the first three quarters are the clean text (consecutive letters, bar a window crossing a \f)
    t0 = MaskedLMWithCLS(CharCorpus(text, train_length=16, mask_prob=0.0), swap_prob=1.0, cls_task="noise_tail")
    x0, _ = t0.train_batch(200, torch.Generator().manual_seed(0))
    step = (x0[:, 1:12] - x0[:, :11]) % 26
    assert ((step == 1).all(1)).float().mean() > 0.9
    assert ((x0[:, 12:] - x0[:, 11:15]) % 26 != 1).float().mean() > 0.8


def _consecutive_text():
    return "\f".join("".join(chr(65 + (i + j) % 26) for j in range(400)) for i in range(12))   # ABC...: next = +1


def test_shuffled_half_keeps_the_characters_and_changes_their_order():
    """cls_task="shuffled_half": a swapped window (y = 0) holds the characters of an intact one, with its last L/2
    in another order; the first half is untouched and the shuffled half leaves the MLM targets."""
    t = MaskedLMWithCLS(CharCorpus(_consecutive_text(), train_length=16, mask_prob=0.0), cls_task="shuffled_half")
    x, y = t.train_batch(400, torch.Generator().manual_seed(3))
    intact, shuffled = y[:, 0] == 1, y[:, 0] == 0
    assert 0.35 < intact.float().mean() < 0.65
    first = ((x[:, 1:8] - x[:, :7]) % 26 == 1).all(1)                          # the first half is the text
    assert first.float().mean() > 0.9                                          # (bar windows crossing a \f)
    expected = (x[:, 7:8] + torch.arange(1, 9)) % 26                           # the text's next 8 characters
    same_set = ((x[:, 8:] % 26).sort(1).values == expected.sort(1).values).all(1)
    in_order = ((x[:, 8:] - x[:, 7:15]) % 26 == 1).all(1)
    assert same_set[first].float().mean() > 0.95                               # a permutation of the text's half
    text = first & same_set                                                    # windows within one document
    assert in_order[text & intact].all() and not in_order[text & shuffled].any()     # ... never the text's order
    mlm = MaskedLMWithCLS(CharCorpus(_consecutive_text(), train_length=16, mask_prob=1.0), swap_prob=1.0,
                          cls_task="shuffled_half")
    _, y1 = mlm.train_batch(64, torch.Generator().manual_seed(0))
    assert (y1[:, 1:9] != IGNORE).all() and (y1[:, 9:] == IGNORE).all()         # only the first half is a target


def test_shuffled_span_shuffles_half_the_window_anywhere():
    """cls_task="shuffled_span": L/2 consecutive characters from an offset drawn uniformly in 0..L/2 leave the
    MLM targets and, in a swapped window, are the text's characters in another order."""
    mlm = MaskedLMWithCLS(CharCorpus(_consecutive_text(), train_length=16, mask_prob=1.0), swap_prob=1.0,
                          cls_task="shuffled_span")
    _, y = mlm.train_batch(900, torch.Generator().manual_seed(0))
    out = y[:, 1:] == IGNORE                                                   # the span, per row
    first = out.float().argmax(1)
    assert (out.sum(1) == 8).all() and (out.gather(1, first[:, None] + torch.arange(8)).all(1)).all()
    counts = torch.bincount(first, minlength=9)
    assert counts.numel() == 9 and (counts > 60).all()                         # offsets 0..8, about 100 each
    t = MaskedLMWithCLS(CharCorpus(_consecutive_text(), train_length=16, mask_prob=0.0), swap_prob=1.0,
                        cls_task="shuffled_span")
    x, y = t.train_batch(400, torch.Generator().manual_seed(3))
    letters = x % 26
    text = (letters.sort(1).values == ((letters.min(1, keepdim=True).values + torch.arange(16)) % 26).sort(1).values).all(1)
    text &= (letters.max(1).values - letters.min(1).values == 15)              # one run of the alphabet, no wrap
    assert text.float().mean() > 0.3
    broken = (x[:, 1:] - x[:, :-1]) % 26 != 1                                   # steps out of order
    assert broken[text].any(1).all() and (y[text, 0] == 0).all()


def test_shuffled_half_of_one_repeated_character_stays_intact():
    """A half of one repeated character has a single order: its window keeps y = 1 even when drawn for a swap,
    and every window labelled 0 differs from the text."""
    text = "\f".join(("a" * 9 + "b" * 9) * 25 for _ in range(8))
    t = MaskedLMWithCLS(CharCorpus(text, train_length=16, mask_prob=0.0), swap_prob=1.0, cls_task="shuffled_half")
    x, y = t.train_batch(400, torch.Generator().manual_seed(1))
    one = (x[:, 8:] == x[:, 8:9]).all(1)
    assert one.any() and (~one).any()
    assert (y[one, 0] == 1).all() and (y[~one, 0] == 0).all()
    t0 = MaskedLMWithCLS(CharCorpus(text, train_length=16, mask_prob=0.0), swap_prob=0.0, cls_task="shuffled_half")
    x0, _ = t0.train_batch(400, torch.Generator().manual_seed(1))            # the same draws, nothing swapped
    assert (x[~one] != x0[~one]).any(1).all()                                  # e.g. aaaabbbb never stays as it was


def test_no_position_no_shuffled_half():
    """Without positions a bidirectional model's [CLS] output is a function of the bag of characters: a window and
    its shuffled half give the same logits (so such a model scores 1/2), while a learned absolute table tells them
    apart."""
    t = MaskedLMWithCLS(CharCorpus(_consecutive_text(), train_length=16, mask_prob=0.0), swap_prob=0.0,
                        cls_task="shuffled_half")
    x, _ = t.train_batch(32, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    shuffled = x.clone()
    shuffled[:, 8:] = x[:, 8:].gather(1, torch.rand(32, 8, generator=g).argsort(-1))
    for scheme, equal in (("nope", True), ("learned", False)):
        torch.manual_seed(0)
        model = posenc.build_model(scheme, t.vocab_size, causal=False, cls_token=True, num_classes=2, d_model=32,
                                   n_heads=4, n_layers=2, max_len=17).eval()
        with torch.no_grad():
            logits = [model.classify(z) for z in (x, shuffled)]             # classifier(h_[CLS])
        assert torch.allclose(*logits, atol=1e-5) is equal, scheme
    plain = posenc.build_model("nope", t.vocab_size, causal=False, d_model=32, n_heads=4, n_layers=1, max_len=16)
    with pytest.raises(ValueError, match="model needs cls_token=True"):
        loss_parts(plain, x, torch.zeros(32, 17, dtype=torch.long))


def test_evaluate_averages_each_metric_over_the_batches():
    """`evaluate`'s mlm, cls and cls_acc are the means over its n_batches held-out batches (drawn in turn from
    one seeded generator on the validation text) of `loss_parts`: cls_acc is an accuracy in [0, 1]."""
    text = "\f".join(f"document {i}: " + "abcdefghij" * 30 for i in range(20))
    t = MaskedLMWithCLS(CharCorpus(text, train_length=16))
    torch.manual_seed(0)
    model = posenc.build_model("tupe", t.vocab_size, causal=False, cls_token=True, num_classes=2,
                               d_model=16, n_heads=2, n_layers=1, max_len=16).eval()
    n_batches, batch_size = 3, 8
    out = t.evaluate(model, n_batches=n_batches, batch_size=batch_size, seed=4)
    g, parts = torch.Generator().manual_seed(4), []
    for _ in range(n_batches):
        x, y = t.batch(t.corpus.valid_ids, batch_size, g)
        parts.append({k: v.item() for k, v in loss_parts(model, x, y).items()})
    for key, name in (("mlm", "mlm"), ("cls", "cls"), ("acc", "cls_acc")):
        assert out[name] == pytest.approx(sum(p[key] for p in parts) / n_batches, rel=1e-5), name
    assert 0.0 < out["cls_acc"] <= 1.0                  # not 0, so a wrong divisor (batch_size = 8) would show
