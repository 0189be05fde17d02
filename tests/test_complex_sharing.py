"""Parameter sharing in complex-order embeddings (Wang et al. 2020, Section 3.1 and Table 4)."""
import pytest
import torch

from posenc.complex_order import (ComplexOrderEmbedding, ComplexOrderTransformer, build_classifier,
                                  shared_frequencies)
from posenc.runs.plans.order import SHARING

V, D = 11, 6
VARIANTS = {"per-word": {}, **SHARING}


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("sharing, expected", [
    ({}, 3 * V * D),                                                      # r_{j,d}, w_{j,d}, theta_{j,d}
    ({"phase": "zero"}, 2 * V * D),                                       # the paper's headline model
    ({"phase": "zero", "frequency": "word-sharing"}, V * D + D),          # w_{.,d}
    ({"phase": "zero", "frequency": "dimension-sharing"}, V * D + V),     # w_{j,.}
    ({"phase": "zero", "amplitude": "word-sharing"}, V * D + D),          # r_{.,d}
    ({"phase": "zero", "amplitude": "dimension-sharing"}, V * D + V),     # r_{j,.}
    ({"phase": "word-sharing"}, 2 * V * D + D),
    ({"frequency": "word-sharing", "amplitude": "dimension-sharing", "phase": "zero"}, V + D),
])
def test_parameter_counts(sharing, expected):
    assert n_params(ComplexOrderEmbedding(V, D, **sharing)) == expected


def test_model_parameter_counts_differ_only_by_the_embedding():
    full = ComplexOrderTransformer(V, 2, d_model=D, n_heads=2)
    shared = ComplexOrderTransformer(V, 2, d_model=D, n_heads=2, phase="zero", frequency="word-sharing")
    assert n_params(full) - n_params(shared) == 2 * V * D - D


def test_default_is_the_unshared_embedding_with_the_same_state_dict():
    torch.manual_seed(0)
    default = ComplexOrderEmbedding(V, D)
    torch.manual_seed(0)
    explicit = ComplexOrderEmbedding(V, D, amplitude="per-word", frequency="per-word", phase="per-word")
    assert default.state_dict().keys() == {"amplitude.weight", "phase.weight", "frequency.weight"}
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), explicit.state_dict().values()))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_draws_the_same_random_numbers(name):
    """A seed gives the same blocks and classifier whatever the sharing: only the embedding differs."""
    torch.manual_seed(5)
    a = ComplexOrderTransformer(V, 2, d_model=D, n_heads=2)
    torch.manual_seed(5)
    b = ComplexOrderTransformer(V, 2, d_model=D, n_heads=2, **VARIANTS[name])
    rest = lambda m: {k: v for k, v in m.state_dict().items() if not k.startswith("embed.")}
    assert all(torch.equal(x, y) for x, y in zip(rest(a).values(), rest(b).values()))
    tokens = torch.arange(V)[None]
    for table in ("amplitude", "frequency", "phase"):                 # the shared part is a slice of the default's
        full, part = a.embed.lookup(table, tokens), b.embed.lookup(table, tokens)
        mode = b.embed.sharing[table]
        if mode == "per-word":
            assert torch.equal(full, part)
        elif mode == "word-sharing":
            assert torch.equal(part, full[:, :1].expand_as(full))
        elif mode == "dimension-sharing":
            assert torch.equal(part, full[..., :1].expand_as(full))
        else:
            assert not part.any()


def train_one_step(emb):
    opt = torch.optim.SGD(emb.parameters(), lr=0.5)
    tokens = torch.randint(0, V, (4, 9))
    f = emb(tokens, torch.arange(9))
    (f.real.square().sum() + f.imag.sin().sum()).backward()
    opt.step()


def test_word_sharing_frequency_is_the_same_for_every_word_before_and_after_training():
    torch.manual_seed(0)
    emb = ComplexOrderEmbedding(V, D, phase="zero", frequency="word-sharing")
    for _ in range(2):
        w = emb.lookup("frequency", torch.arange(V)[None])[0]           # (V, D)
        assert torch.equal(w, w[:1].expand_as(w))
        train_one_step(emb)
    assert not torch.equal(w[0], shared_frequencies(D))                 # it did train


def test_dimension_sharing_tables_are_constant_across_dimensions():
    torch.manual_seed(0)
    emb = ComplexOrderEmbedding(V, D, phase="zero", frequency="dimension-sharing", amplitude="dimension-sharing")
    train_one_step(emb)
    for table in ("frequency", "amplitude"):
        x = emb.lookup(table, torch.arange(V)[None])[0]                 # (V, D)
        assert torch.equal(x, x[:, :1].expand_as(x)) and x[:, 0].unique().numel() == V


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("k", [1, 5, 1000])
def test_order_property_holds_under_sharing(name, k):
    """f(j, p + k) = f(j, p) rotated per dimension by k * w_{j,d}, for trained (random) tables."""
    torch.manual_seed(1)
    emb = ComplexOrderEmbedding(V, D, **VARIANTS[name]).double()      # float64 angles: k up to 1000
    with torch.no_grad():
        for p in emb.parameters():
            p.normal_()
    tokens, pos = torch.randint(0, V, (3, 8)), torch.arange(8) * 3
    w = emb.lookup("frequency", tokens)
    rotated = emb(tokens, pos) * torch.polar(torch.ones_like(w), k * w)
    assert torch.allclose(emb(tokens, pos + k), rotated, atol=1e-9)
    assert torch.allclose(emb(tokens, pos + k).abs(), emb.lookup("amplitude", tokens).abs(), atol=1e-9)


def test_word_sharing_period_makes_embedding_products_relative():
    """With w_{.,d} shared, <f(j, p), f(k, q)> depends on p - q only (the relative property of Eq. eq-relative)."""
    torch.manual_seed(2)
    emb = ComplexOrderEmbedding(V, D, phase="zero", frequency="word-sharing")
    tokens = torch.randint(0, V, (1, 7))
    gram = lambda pos: (lambda f: f @ f.conj().transpose(-1, -2))(emb(tokens, pos))
    assert torch.allclose(gram(torch.arange(7)), gram(torch.arange(7) + 50), atol=1e-3)
    unshared = ComplexOrderEmbedding(V, D, phase="zero")
    with torch.no_grad():
        unshared.frequency.weight.uniform_(0, 1)
    gram = lambda pos: (lambda f: f @ f.conj().transpose(-1, -2))(unshared(tokens, pos))
    assert not torch.allclose(gram(torch.arange(7)), gram(torch.arange(7) + 50), atol=1e-3)


def test_dimension_sharing_period_hides_position_from_the_modulus_score():
    """w_{j,.}: f(j, p) = exp(i w_j p) r_j, a scalar phase per token; complex linear maps and the layer norm
    (while its offset beta is 0) commute with it, so |q_i . conj(k_j)| does not depend on positions."""
    torch.manual_seed(3)
    model = ComplexOrderTransformer(V, 2, d_model=8, n_heads=2, phase="zero", frequency="dimension-sharing")
    with torch.no_grad():
        model.embed.frequency.weight.uniform_(0.1, 2.0)
    tokens = torch.randint(0, V, (2, 10))
    a = model.attention_maps(tokens, torch.arange(10))[0]
    b = model.attention_maps(tokens, torch.randperm(10) * 7)[0]
    assert torch.allclose(a, b, atol=1e-5)
    with torch.no_grad():
        model.blocks[0].ln1.beta.normal_()                             # a complex offset breaks the symmetry
    assert not torch.allclose(model.attention_maps(tokens, torch.arange(10))[0],
                              model.attention_maps(tokens, torch.randperm(10) * 7)[0], atol=1e-5)


def test_word_sharing_amplitude_forgets_the_word_at_position_zero():
    torch.manual_seed(4)
    emb = ComplexOrderEmbedding(V, D, phase="zero", amplitude="word-sharing")
    f = emb(torch.arange(V)[None], torch.zeros(V, dtype=torch.long))[0]  # every word at position 0
    assert torch.allclose(f, f[:1].expand_as(f))


def test_vanilla_freezes_shared_frequencies_too():
    emb = ComplexOrderEmbedding(V, D, order=False, phase="zero", frequency="dimension-sharing")
    assert not emb.frequency.weight.requires_grad and not emb.frequency.weight.any()


def test_build_classifier_passes_sharing_and_refuses_it_elsewhere():
    model = build_classifier("complex-order", V, 2, d_model=8, n_heads=2, n_layers=1, max_len=12,
                             phase="zero", frequency="word-sharing")
    assert model.embed.sharing == {"amplitude": "per-word", "frequency": "word-sharing", "phase": "zero"}
    with pytest.raises(ValueError, match="complex-order"):
        build_classifier("sinusoidal", V, 2, d_model=8, n_heads=2, n_layers=1, max_len=12, phase="zero")
    with pytest.raises(TypeError, match="unknown"):
        build_classifier("complex-order", V, 2, d_model=8, n_heads=2, n_layers=1, max_len=12, period="shared")


@pytest.mark.parametrize("arg, value", [("amplitude", "zero"), ("frequency", "zero"), ("phase", "words"),
                                        ("frequency", None)])
def test_bad_sharing_is_refused(arg, value):
    with pytest.raises(ValueError, match=arg):
        ComplexOrderEmbedding(V, D, **{arg: value})
