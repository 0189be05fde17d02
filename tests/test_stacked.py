"""Seeds trained as one stacked model (`posenc.runs.stacked`): every scheme under `torch.func.vmap`,
the stacked trainer against separate `train` calls, per-seed clipping, refusals, and the runner."""
from collections import Counter

import math
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend

import posenc
import posenc.runs.stacked as stacking
from posenc.host import host_checked
from posenc.model import build_model, lm_loss
from posenc.runs import RunSpec, Store, run_specs
from posenc.runs.execute import execute, seed_groups
from posenc.runs.recipes import stack_refusal
from posenc.runs.stacked import STACKED_SDPA, check_stackable, clip_per_seed, stack_models, train_stacked
from posenc.tasks import make_task

from conftest import small_model
from test_host_sync import HostReads, RandomTokens

VMAP_SCHEMES = sorted(name for name, cls in posenc.SCHEMES.items() if cls.vmappable)
#: On the CPU, SDPA's fused kernel has no vmap rule and runs copy by copy (correct, slower): PyTorch warns.
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet implemented")


def seeded(scheme, seeds, causal=True, **kw):
    out = []
    for s in seeds:
        torch.manual_seed(s)
        out.append(small_model(scheme, causal=causal, **kw).train())
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scheme", VMAP_SCHEMES)
def test_every_scheme_runs_under_vmap_as_it_runs_alone(scheme, causal):
    """vmap over K stacked copies gives each copy's own loss and gradients: the property stacking rests on."""
    if not causal and posenc.SCHEMES[scheme].causal_only:
        pytest.skip(f"{scheme} is causal only")
    models = seeded(scheme, (1, 2, 3), causal=causal)
    params, buffers = stack_module_state(models)
    x, y = torch.randint(0, 23, (3, 4, 12)), torch.randint(0, 23, (3, 4, 12))

    def loss(p, b, xs, ys):
        return lm_loss(functional_call(models[0], (p, b), (xs,)), ys)
    with host_checked():
        losses = vmap(loss)(params, buffers, x, y)
    losses.sum().backward()
    for k, model in enumerate(models):
        with host_checked():
            alone = lm_loss(model(x[k]), y[k])
        alone.backward()
        torch.testing.assert_close(losses[k], alone, rtol=1e-5, atol=1e-6)
        for name, p in model.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(params[name].grad[k], p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("scheme", sorted(set(posenc.SCHEMES) - set(VMAP_SCHEMES)))
def test_a_scheme_marked_not_vmappable_indeed_fails_under_vmap(scheme):
    models = seeded(scheme, (1, 2))
    params, buffers = stack_module_state(models)
    with pytest.raises(RuntimeError), host_checked():
        vmap(lambda p, b, x: functional_call(models[0], (p, b), (x,)))(params, buffers, torch.randint(0, 23, (2, 3, 8)))


@pytest.mark.parametrize("scheme", ["rope", "t5", "floater", "learned", "alibi", "xl"])
def test_stacked_training_gives_the_models_separate_training_gives(scheme):
    task = make_task("corpus", train_length=16)
    cfgs = [posenc.TrainConfig(steps=12, batch_size=4, warmup=2, log_every=4, seed=s, progress=False, device="cpu")
            for s in (3, 8)]
    alone = seeded(scheme, (3, 8), max_len=16, vocab=task.vocab_size)
    stacked = seeded(scheme, (3, 8), max_len=16, vocab=task.vocab_size)
    ra = [posenc.train(m, task, c) for m, c in zip(alone, cfgs)]
    rb = train_stacked(stacked, task, cfgs)
    for a, b, ma, mb in zip(ra, rb, alone, stacked):
        assert [h["step"] for h in a.history] == [h["step"] for h in b.history] == [4, 8, 12]
        assert [h["lr"] for h in a.history] == [h["lr"] for h in b.history]
        torch.testing.assert_close([h["loss"] for h in b.history], [h["loss"] for h in a.history], rtol=1e-5, atol=0)
        for (name, p), q in zip(ma.named_parameters(), mb.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)
        assert not mb.training
    assert not torch.equal(stacked[0].tok.weight, stacked[1].tok.weight)   # the seeds stayed distinct


def test_buffers_that_differ_between_models_are_stacked_and_equal_ones_shared():
    models = seeded("alibi", (0, 1))
    with torch.no_grad():
        models[1].scheme.slopes.mul_(3.0)                      # another bias per head in the second model
    params, buffers, step_losses = stack_models(models, lambda m, x, y: lm_loss(m(x), y))
    assert list(buffers) == ["model.scheme.slopes"] and buffers["model.scheme.slopes"].shape[0] == 2
    assert set(params) == {n for n, _ in models[0].named_parameters()}
    x, y = torch.randint(0, 23, (2, 3, 10)), torch.randint(0, 23, (2, 3, 10))
    with host_checked(), torch.no_grad():
        losses = step_losses(params, buffers, x, y)
        alone = [lm_loss(m(x[k]), y[k]) for k, m in enumerate(models)]
    torch.testing.assert_close(losses, torch.stack(alone), rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 4), scale=st.floats(0.01, 100.0), clip=st.floats(0.1, 10.0), seed=st.integers(0, 10_000))
def test_clipping_per_seed_is_clip_grad_norm_on_each_seed(k, scale, clip, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(k, 3, 5), (k, 7), (k,)]
    stacked = [torch.zeros(s, requires_grad=True) for s in shapes]
    for p in stacked:
        p.grad = torch.randn(p.shape, generator=g) * scale
    singles = [[torch.zeros(s[1:], requires_grad=True) for s in shapes] for _ in range(k)]
    for i, ps in enumerate(singles):
        for p, q in zip(ps, stacked):
            p.grad = q.grad[i].clone()
    norms = clip_per_seed(stacked, clip)
    for i, ps in enumerate(singles):
        norm = torch.nn.utils.clip_grad_norm_(ps, clip)
        torch.testing.assert_close(norms[i], norm, rtol=1e-5, atol=1e-6)
        for p, q in zip(ps, stacked):
            torch.testing.assert_close(q.grad[i], p.grad, rtol=1e-5, atol=1e-7)


def test_a_stacked_step_reads_nothing_from_the_device(monkeypatch):
    seen = Counter()
    real = stacking.stacked_step

    def step(*args, **kwargs):
        with HostReads() as mode:
            out = real(*args, **kwargs)
        seen.update(mode.calls)
        return out
    monkeypatch.setattr(stacking, "stacked_step", step)
    for scheme in ("rope", "t5", "floater", "alibi", "deberta"):
        cfgs = [posenc.TrainConfig(steps=2, batch_size=4, warmup=1, seed=s, progress=False, device="cpu") for s in (0, 1)]
        train_stacked(seeded(scheme, (0, 1)), RandomTokens(), cfgs)
    assert dict(seen) == {}


def cfgs_for(*seeds, **changes):
    settings = {"steps": 2, "batch_size": 4, "progress": False, "device": "cpu", **changes}
    return [posenc.TrainConfig(seed=s, **settings) for s in seeds]


@pytest.mark.parametrize("cfgs, match", [
    (cfgs_for(0, 1)[:1] + [posenc.TrainConfig(steps=2, batch_size=4, progress=False, device="cpu", seed=1, lr=0.1)],
     "differ in their seed only; lr"),
    (cfgs_for(0, 0), "distinct seeds"),
    (cfgs_for(0, 1, random_positions=64), "random_positions"),
    (cfgs_for(0, 1, checkpoint_path="x.pt"), "checkpoint_path"),
])
def test_settings_that_cannot_be_stacked_are_refused_by_name(cfgs, match):
    with pytest.raises(ValueError, match=match):
        check_stackable(seeded("nope", (0, 1)), cfgs)


def test_models_that_cannot_be_stacked_are_refused_by_name():
    with pytest.raises(ValueError, match="other parameters"):
        check_stackable([small_model("nope"), small_model("nope", d_model=64)], cfgs_for(0, 1))
    with pytest.raises(ValueError, match="GRU"):
        check_stackable(seeded("rnn", (0, 1)), cfgs_for(0, 1))
    flex = seeded("alibi", (0, 1))
    flex[0].attention_backend = "flex"
    with pytest.raises(ValueError, match="attention_backend='flex'"):
        check_stackable(flex, cfgs_for(0, 1))


@pytest.mark.parametrize("scheme", sorted(posenc.SCHEMES))
def test_a_causal_model_reads_a_right_padded_batch_as_the_unpadded_one(scheme):
    """What padding the seeds' batches to one length rests on: outputs before n do not change when
    tokens are appended after n (the sequence gets longer: positions, tables and ODE grids with it)."""
    model = small_model(scheme, causal=True)
    x = torch.randint(0, 23, (3, 9))
    padded = torch.cat([x, torch.randint(0, 23, (3, 7))], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :9], model(x), rtol=1e-5, atol=1e-5)


def test_pad_right_pads_tokens_with_zero_and_targets_with_ignore():
    from posenc.model import IGNORE
    xs, ys = [torch.ones(2, 3, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)], [torch.full((2, 3), 4),
                                                                                          torch.full((2, 5), 4)]
    px, py = stacking.pad_right(xs, ys, step=0)
    assert [tuple(x.shape) for x in px] == [(2, 5), (2, 5)] and torch.equal(px[1], xs[1])
    assert px[0][:, 3:].eq(0).all() and py[0][:, 3:].eq(IGNORE).all() and torch.equal(py[0][:, :3], ys[0])
    with pytest.raises(ValueError, match="not one per token"):
        stacking.pad_right(xs, [torch.zeros(2), torch.zeros(2)], step=0)


def test_seeds_of_a_task_that_draws_lengths_train_padded_as_they_train_alone():
    task = make_task("synthetic", name="reverse", train_length=8)
    cfgs = cfgs_for(4, 9, steps=10, batch_size=6, warmup=2, log_every=5)
    alone = seeded("rope", (4, 9), vocab=task.vocab_size, max_len=32)
    stacked = seeded("rope", (4, 9), vocab=task.vocab_size, max_len=32)
    shapes = {task.train_batch(6, posenc.runs.train.step_generator(s, t), True)[0].shape for s in (4, 9) for t in range(10)}
    assert len(shapes) > 1                                    # the seeds' lengths do differ: padding is exercised
    ra = [posenc.train(m, task, c) for m, c in zip(alone, cfgs)]
    rb = train_stacked(stacked, task, cfgs)
    for a, b, ma, mb in zip(ra, rb, alone, stacked):
        torch.testing.assert_close([h["loss"] for h in b.history], [h["loss"] for h in a.history], rtol=1e-5, atol=0)
        for (name, p), q in zip(ma.named_parameters(), mb.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)


def test_models_that_cannot_be_padded_are_refused_when_lengths_differ():
    from posenc.runs.stacked import can_pad
    task = make_task("synthetic", name="reverse", train_length=8)
    bidirectional = seeded("nope", (0, 1), causal=False, vocab=task.vocab_size)
    assert not can_pad(bidirectional[0]) and can_pad(seeded("nope", (0,))[0])
    assert not can_pad(small_model("rope", scaling="dynamic", factor=2.0,
                                   scaling_params={"original_max_position_embeddings": 16}))
    with pytest.raises(ValueError, match="cannot be padded"):
        train_stacked(bidirectional, task, cfgs_for(0, 1, batch_size=2, steps=50))


def test_auto_attention_backend_is_restored_after_stacking():
    models = seeded("t5", (0, 1))
    train_stacked(models, RandomTokens(), cfgs_for(0, 1))
    assert models[0].attention_backend == "auto"


def spec(seed, **changes):
    base = dict(scheme="t5", task="corpus", task_kwargs={"train_length": 16},
                model={"d_model": 32, "n_layers": 1, "causal": True},
                train={"steps": 6, "batch_size": 4, "log_every": 3, "warmup": 1}, seed=seed, lengths=(16, 32),
                eval={"max_tokens": 512})
    return RunSpec(**{**base, **changes})


def test_stack_refusal_says_why():
    assert stack_refusal([spec(0), spec(1)]) is None
    assert stack_refusal([spec(0)]) == "a single seed"
    assert "differ in more than their seeds" in stack_refusal([spec(0), spec(1, scheme="rope")])
    varying = {"task": "synthetic", "task_kwargs": {"name": "reverse", "train_length": 8}, "eval": {}}
    assert stack_refusal([spec(s, **varying) for s in (0, 1)]) is None          # causal: padded
    assert "cannot be padded" in stack_refusal(
        [spec(s, model={"d_model": 32, "causal": False}, **varying) for s in (0, 1)])
    one_length = {**varying, "task_kwargs": {"name": "reverse", "train_length": 8, "min_train_length": 8}}
    assert stack_refusal([spec(s, model={"d_model": 32, "causal": False}, **one_length) for s in (0, 1)]) is None
    assert "'dynamic' scaling depends on it" in stack_refusal(
        [spec(s, scheme="rope", model={"d_model": 32, "causal": True, "scaling": "dynamic", "factor": 2.0,
                                       "scaling_params": {"original_max_position_embeddings": 16}}, **varying)
         for s in (0, 1)])
    assert "no stacked form" in stack_refusal([spec(s, recipe="xl_memory") for s in (0, 1)])
    assert "does not run under torch.func.vmap" in stack_refusal([spec(s, scheme="rnn") for s in (0, 1)])


def test_seed_groups_keep_the_seeds_of_one_spec_together():
    specs = [spec(0), spec(0, scheme="rope"), spec(1), spec(1, scheme="rope"), spec(2)]
    assert seed_groups(specs, stack=False) == [[s] for s in specs]
    assert seed_groups(specs, stack=True) == [[specs[0], specs[2], specs[4]], [specs[1], specs[3]]]


def test_the_runner_stores_stacked_records_close_to_the_ones_run_alone(tmp_path):
    specs = [spec(s) for s in (0, 1, 2)]
    stacked, alone = Store("ci", tmp_path / "stacked"), Store("ci", tmp_path / "alone")
    out = run_specs(specs, stacked, workers=1, progress=False, stack_seeds=True)
    assert sorted(out["done"]) == sorted(s.key for s in specs) and not out["failed"]
    for s in specs:
        execute(s, alone, "cpu")
        a, b = alone.get(s), stacked.get(s)
        assert b["stacked"] == 3 and "stacked" not in a
        torch.testing.assert_close(b["final_loss"], a["final_loss"], rtol=1e-5, atol=0)
        for ra, rb in zip(a["table"], b["table"]):
            assert ra["length"] == rb["length"]
            torch.testing.assert_close(rb["nll"], ra["nll"], rtol=1e-5, atol=0)


def test_a_stacked_record_holds_its_share_of_the_groups_wall_time(tmp_path, monkeypatch):
    """K seeds trained together in T seconds: each record says T / K (the cost model refits from records)."""
    import importlib
    import types
    ex = importlib.import_module("posenc.runs.execute")     # the module: posenc.runs.execute is also a function
    clock = iter([100.0, 112.0])
    monkeypatch.setattr(ex, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    specs = [spec(s, train={"steps": 2, "batch_size": 4, "log_every": 1, "warmup": 1}) for s in (0, 1, 2)]
    ex.execute_stacked(specs, Store("ci", tmp_path), "cpu")
    assert [Store("ci", tmp_path).get(s)["seconds"] for s in specs] == [4.0, 4.0, 4.0]


def test_the_runner_stacks_pretraining_seeds(tmp_path):
    specs = [RunSpec(scheme="tupe", task="mlm_cls", task_kwargs={"train_length": 16}, model={"d_model": 32, "n_layers": 1},
                     train={"steps": 4, "batch_size": 4, "log_every": 2, "warmup": 1}, seed=s, recipe="pretrain")
             for s in (0, 1)]
    assert stack_refusal(specs) is None
    stacked, alone = Store("ci", tmp_path / "stacked"), Store("ci", tmp_path / "alone")
    run_specs(specs, stacked, workers=1, progress=False, stack_seeds=True)
    for s in specs:
        execute(s, alone, "cpu")
        a, b = alone.get(s), stacked.get(s)
        assert b["stacked"] == 2
        for key in ("mlm", "cls", "final_loss"):
            torch.testing.assert_close(b["table"][0][key], a["table"][0][key], rtol=1e-5, atol=0)


CLASSIFIER = dict(scheme="complex-order", task="contrast", task_kwargs={"length": 12}, model={"d_model": 32, "n_heads": 2, "n_layers": 1},
                  recipe="classify")
VIT = dict(scheme="learned", task="digits", task_kwargs={"image_size": 16},
           model={"patch_size": 4, "stem": "patch", "d_model": 32, "n_heads": 2, "n_layers": 1}, recipe="vit",
           options={"variants": [["learned, interpolated", "interpolate", False]], "hi": 32, "ft_steps": 4, "ft_lr": 1e-3})


@pytest.mark.parametrize("kind", [CLASSIFIER, VIT], ids=["classify", "vit"])
def test_the_runner_stacks_classifiers_and_vits_with_their_later_stages_alone(tmp_path, kind):
    """The trainings stack; what a recipe does after (a ViT's fine-tunes at another resolution) runs per seed."""
    specs = [RunSpec(**kind, train={"steps": 6, "batch_size": 8, "log_every": 3, "warmup": 1}, seed=s) for s in (0, 1)]
    assert stack_refusal(specs) is None
    stacked, alone = Store("ci", tmp_path / "stacked"), Store("ci", tmp_path / "alone")
    out = run_specs(specs, stacked, workers=1, progress=False, stack_seeds=True)
    assert not out["failed"]
    for s in specs:
        execute(s, alone, "cpu")
        a, b = alone.get(s), stacked.get(s)
        assert b["stacked"] == 2 and len(a["table"]) == len(b["table"])
        torch.testing.assert_close(b["final_loss"], a["final_loss"], rtol=1e-5, atol=0)
        for ra, rb in zip(a["table"], b["table"]):
            assert ra.keys() == rb.keys()
            for key, value in ra.items():
                if isinstance(value, float):
                    torch.testing.assert_close(rb[key], value, rtol=1e-4, atol=1e-6, msg=key)


def test_a_group_whose_stacking_fails_is_trained_one_by_one(tmp_path, monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("no batching rule on this device")
    monkeypatch.setattr(stacking, "train_stacked", broken)
    specs = [spec(s) for s in (0, 1)]
    store = Store("ci", tmp_path)
    out = run_specs(specs, store, workers=1, progress=False, stack_seeds=True)
    assert sorted(out["done"]) == sorted(s.key for s in specs)
    assert "training them one by one" in capsys.readouterr().out
    assert all("stacked" not in store.get(s) for s in specs)


def test_the_stacking_benchmark_times_both_ways_and_finds_the_same_losses():
    from posenc.bench.stacking import stacking_costs
    rows = stacking_costs(("nope",), steps=3, seq_len=8, batch_size=2, d_model=16, n_heads=2, n_layers=1, rounds=1)
    [row] = list(rows)
    assert row["single_s"] > 0 and row["stacked_s"] > 0 and row["speedup"] == row["single_s"] / row["stacked_s"]
    assert row["seed_steps_per_s_single"] == pytest.approx(3 * 3 / row["single_s"])
    assert row["loss_gap"] < 1e-5                                  # fp32 on the CPU: rounding only
    assert abs(row["loss_stacked"] / row["loss_single"] - 1) <= row["loss_gap"] + 1e-12   # the means within the gap
    with pytest.raises(ValueError, match="seeds must be an int >= 2"):
        stacking_costs(seeds=1)


@pytest.mark.parametrize("trainer", ["alone", "stacked"])
def test_training_draws_nothing_from_the_global_rng(trainer):
    """What lets a stacked recipe finish each seed with the global RNG where its preparation left it."""
    task = make_task("synthetic", name="reverse", train_length=8)
    models = seeded("rope", (0, 1), vocab=task.vocab_size, max_len=32)
    before = torch.get_rng_state()
    if trainer == "alone":
        posenc.train(models[0], task, cfgs_for(0, steps=3)[0])
    else:
        train_stacked(models, task, cfgs_for(0, 1, steps=3))
    assert torch.equal(torch.get_rng_state(), before)


def test_the_dry_run_says_how_much_would_stack():
    from posenc.runs.__main__ import stacking_summary
    specs = [spec(0), spec(1), spec(2), spec(0, scheme="rnn"), spec(1, scheme="rnn"), spec(0, scheme="rope")]
    text = stacking_summary(specs)
    assert text.startswith("--stack-seeds: 3 of 6 runs in 1 stacked groups (")


def test_a_record_names_the_thread_count_it_was_trained_with(tmp_path):
    """The machine line is read while the run's one-thread setting holds, not after it is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        record = execute(spec(0), Store("ci", tmp_path), "cpu")
        assert "1 torch thread;" in record["machine"] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_window_stacks_seeds_only_when_the_probe_was_faster_with_the_same_losses():
    """stack_decision: median speedup >= 1.2 and every loss gap < 2%; a NaN gap refuses wherever it sits (max()
    over [0.01, nan] returns 0.01). The 2026-12-04 H200 probe: 1.54x and 1.23x, both gaps NaN: refused."""
    from posenc.bench.stacking import stack_decision
    nan = float("nan")
    h200 = [{"scheme": "nope", "speedup": 1.542, "loss_gap": nan}, {"scheme": "rope", "speedup": 1.233, "loss_gap": nan}]
    ok, why = stack_decision(h200)
    assert not ok and "NaN" in why and "1.39x" in why
    assert stack_decision([{"speedup": 1.5, "loss_gap": 0.001}, {"speedup": 1.3, "loss_gap": 0.004}])[0]
    assert not stack_decision([{"speedup": 1.5, "loss_gap": 0.001}, {"speedup": 1.3, "loss_gap": nan}])[0]
    assert not stack_decision([{"speedup": 1.1, "loss_gap": 0.001}])[0]                 # too little speedup
    assert not stack_decision([{"speedup": 2.0, "loss_gap": 0.05}])[0]                  # losses apart
    with pytest.raises(ValueError, match="loss_gap"):
        stack_decision([{"speedup": 2.0}])


def test_stacked_training_runs_sdpa_on_the_math_kernel_alone(monkeypatch):
    """The fused SDPA kernels fail under vmap on the H200 (STACKED_SDPA): every attention call of a stacked
    run sees the flash, memory-efficient and cuDNN kernels switched off, and they are on again after it."""
    import torch.nn.functional as F
    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                     torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    task = make_task("corpus", train_length=8)
    cfgs = [posenc.TrainConfig(steps=2, batch_size=2, warmup=1, log_every=2, seed=s, progress=False) for s in range(2)]
    models = [build_model("nope", task.vocab_size, causal=True, d_model=16, n_heads=2, n_layers=1, max_len=8)
              for _ in cfgs]
    train_stacked(models, task, cfgs)
    assert seen and set(seen) == {(False, False, False, True)}
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()


def test_a_nan_stacked_loss_brings_the_variants_that_name_its_cause(monkeypatch):
    """stacking_costs: where the stacked loss is NaN (the 2026-12-04 H200 probes), the row adds the same stacked run
    without autocast, and with SDPA's fused kernels allowed; a variant that raises (the H200's "LSE is not
    correctly aligned") is a NaN loss and its error, not a crashed probe. Here a stand-in that is NaN under
    autocast and raises when the fused kernels are allowed shows the plumbing."""
    import posenc.bench.stacking as stacking
    real = stacking.train_stacked

    def fails_like_the_h200(models, task, cfgs, loss_fn=None, *, sdpa=STACKED_SDPA):
        if sdpa != SDPBackend.MATH:
            raise RuntimeError("LSE is not correctly aligned (strideH)\nmore lines")
        out = real(models, task, cfgs, loss_fn, sdpa=sdpa)
        if cfgs[0].amp == "auto":
            for r in out:
                r.final_loss = float("nan")
        return out

    monkeypatch.setattr(stacking, "train_stacked", fails_like_the_h200)
    [row] = list(stacking.stacking_costs(("nope",), steps=2, seq_len=8, batch_size=2, d_model=16, n_heads=2,
                                         n_layers=1, rounds=1))
    assert math.isnan(row["loss_stacked"]) and math.isnan(row["loss_gap"]) and math.isfinite(row["loss_single"])
    assert math.isfinite(row["loss_stacked_fp32"]) and "error_stacked_fp32" not in row
    assert math.isnan(row["loss_stacked_fused"])
    assert row["error_stacked_fused"] == "RuntimeError: LSE is not correctly aligned (strideH)"
    assert row["loss_stacked_fp32"] == pytest.approx(row["loss_single"], rel=1e-4)   # fp32 on the CPU: the same run
    monkeypatch.setattr(stacking, "train_stacked", real)
    [row] = list(stacking.stacking_costs(("nope",), steps=2, seq_len=8, batch_size=2, d_model=16, n_heads=2,
                                         n_layers=1, rounds=1))
    assert "loss_stacked_fp32" not in row                     # finite: no variants run


@pytest.mark.parametrize("scheme, causal", [("alibi", True), ("t5", True), ("nope", False), ("rope", False)])
def test_stacked_attention_with_a_mask_or_both_directions_softmaxes_in_float32_without_sdpa(monkeypatch, scheme,
                                                                                            causal):
    """Under vmap and bf16 autocast, SDPA's math kernel gave such groups a softmax whose backward saw two dtypes on the
    H200 (`posenc.attention._stacked`). Stacked, they take the explicit path: no SDPA call, and every softmax and its
    backward in float32, forward and gradient alike."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    calls, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))

    class Softmaxes(TorchDispatchMode):
        dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("_softmax", "_safe_softmax", "_softmax_backward_data"):
                self.dtypes.append((func.__name__, {a.dtype for a in args if isinstance(a, torch.Tensor)}))
            return func(*args, **(kwargs or {}))

    models = seeded(scheme, [0, 1], causal=causal)
    params, buffers, step_losses = stack_models(models, lambda m, x, y: lm_loss(m(x), y))
    x = torch.randint(0, models[0].vocab_size, (2, 2, 8))
    with host_checked(), Softmaxes():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses = step_losses(params, buffers, x, x)
        losses.sum().backward()
    assert not calls
    assert {name.split(".")[0] for name, _ in Softmaxes.dtypes} == {"_softmax", "_softmax_backward_data"}
    assert all(d == {torch.float32} for _, d in Softmaxes.dtypes), Softmaxes.dtypes
    assert torch.isfinite(losses).all()
