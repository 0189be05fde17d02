"""The settings each multi-stage recipe hands to its later stages: fine-tuning rates and seeds, the
scaling each named variant applies, the grid a ViT variant reads its positions on, the seed of each
length's randomized positions. Stored records are not retrained by the tests for these recipes (they
take minutes), so a wrong setting here would change the book's numbers with no test failing."""
import pytest
import torch

import posenc.runs.train as train_module
from posenc.runs.plans import plan
from posenc.runs.recipes import get_recipe, random_position_table


def first_spec(chapter, recipe, randomized=False, **changes):
    spec = next(s for _, s in plan(chapter, "ci") if s.recipe == recipe and randomized == ("random_positions" in s.train))
    return spec.replace(**changes)


@pytest.fixture
def configs(monkeypatch):
    """Every TrainConfig that `train` receives, in order (training itself runs as usual)."""
    seen, real = [], train_module.train

    def recording(model, task, cfg, *args, **kwargs):
        seen.append(cfg)
        return real(model, task, cfg, *args, **kwargs)
    monkeypatch.setattr(train_module, "train", recording)
    return seen


def test_learned_extension_fine_tunes_each_chunk_at_its_rate_with_a_seed_of_its_own(configs):
    """Chapter 01: after the base run, each chunk of fine-tuning at 2L runs at options' lr (default 2e-3,
    constant) for `chunk` steps, seeded 1000 (c + 1) + seed, so chunks draw different batches and every init
    draws the same ones."""
    spec = first_spec("01_learned", "learned_extension", seed=3, train={"steps": 2, "warmup": 1, "batch_size": 4},
                      options={"chunk": 1, "chunks": 2, "inits": ["copy", "interpolate"]})
    get_recipe("learned_extension")(spec)
    base, *chunks = configs
    assert base.steps == 2 and base.seed == 3
    assert [(c.steps, c.lr, c.min_lr_ratio, c.seed, c.batch_size) for c in chunks] == \
        [(1, 2e-3, 1.0, 1003, 4), (1, 2e-3, 1.0, 2003, 4)] * 2


def test_rope_extension_applies_the_scaling_each_variant_names(monkeypatch, configs):
    """Chapter 11: the PI rows interpolate, the NTK rows rescale the base, plain RoPE is fine-tuned unscaled,
    and exactly the 'fine-tuned' rows train again, on windows of 4L."""
    from posenc.schemes.rotary import RoPE
    events, real = [], RoPE.set_scaling

    def recording(self, scaling, factor=1.0, **params):
        events.append(("scale", scaling, factor))
        return real(self, scaling, factor, **params)
    monkeypatch.setattr(RoPE, "set_scaling", recording)
    spec = first_spec("11_rope", "rope_extension", train={"steps": 2, "warmup": 1, "batch_size": 2},
                      lengths=(32,), eval={"max_tokens": 256}, options={"factor": 4, "ft_steps": 1, "ft_batch": 2})
    rows = get_recipe("rope_extension")(spec)["table"]
    assert events == [("scale", None, 1.0),                               # the base model, built unscaled
                      ("scale", "pi", 4), ("scale", "ntk", 4), ("scale", None, 1), ("scale", "pi", 4),
                      ("scale", "ntk", 4)]
    assert [c.steps for c in configs] == [2, 1, 1, 1]                  # the base run, then three fine-tunes
    assert [r["variant"] for r in rows] == ["rope", "RoPE + PI x4", "RoPE + NTK x4", "RoPE, fine-tuned at 4L",
                                            "RoPE + PI x4, fine-tuned", "RoPE + NTK x4, fine-tuned"]


def test_a_vit_variant_with_scaled_coordinates_reads_the_new_grid_on_the_old_one(monkeypatch):
    """Chapter 13: a 'scaled' variant scores (and fine-tunes) the high-resolution model with its patch
    coordinates read on the low-resolution grid; the others on their own grid (ref_grid None)."""
    from posenc.tasks.digits import DigitsTask
    grids, real = [], DigitsTask.accuracy

    def recording(self, model, split="test", batch_size=512, **kwargs):
        grids.append((self.image_size, kwargs.get("ref_grid")))
        return real(self, model, split, batch_size, **kwargs)
    monkeypatch.setattr(DigitsTask, "accuracy", recording)
    spec = first_spec("13_vit", "vit", scheme="rope2d", train={"steps": 2, "warmup": 1, "batch_size": 8},
                      options={"variants": [["scaled", None, True], ["patch index", None, False]], "hi": 32,
                               "ft_steps": 1, "ft_lr": 1e-3})
    get_recipe("vit")(spec)
    high = [g for size, g in grids if size == 32]
    assert high == [(4, 4), (4, 4), None, None]      # 16 px / 4 px patches: the low-resolution grid is 4 x 4


def test_randomized_positions_are_drawn_from_a_seed_of_each_length_and_evaluation_seed(monkeypatch):
    """Each evaluation length reads the model at positions of its own draw, and another evaluation seed draws
    others: one generator seeded per (seed, length), never one shared sequence of draws."""
    seeds = []

    class Recording(train_module.RandomPositions):
        def __init__(self, model, max_position, seed=0):
            seeds.append(seed)
            super().__init__(model, max_position, seed)
    monkeypatch.setattr(train_module, "RandomPositions", Recording)
    spec = first_spec("17_learned_biases", "sequence", randomized=True, lengths=(12, 24), eval={"n_samples": 4})
    from posenc.runs.recipes import build_untrained, make_task
    torch.manual_seed(0)
    model, task = build_untrained(spec), make_task(spec.task, **spec.task_kwargs)
    rows = random_position_table(model, task, spec)
    random_position_table(model, task, spec.replace(eval={"n_samples": 4, "seed": 1}))
    assert {r["positions"] for r in rows} == {"random"} and len(set(seeds)) == 4
