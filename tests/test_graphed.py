"""The training step as a CUDA graph (`posenc.runs.graphed`) and its probe (`posenc.bench.graphs`).

A graph replays the eager step's kernels, so on a GPU it must train exactly as the eager step does:
the CUDA tests compare parameters and losses after the same batches (they run in a GPU window, with
`scripts/gpu_costs.sh`). On the CPU only the refusals and the probe's decision can be checked.
"""
import math
import os

import pytest
import torch

from posenc.model import build_model, lm_loss
from posenc.runs.graphed import GraphedStep, capturable_adamw, set_lr
from posenc.runs.train import decay_groups, optimizer_step

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a CUDA device")


def loss_fn(m, x, y, **kw):
    return lm_loss(m(x, **kw), y)


def tiny(scheme="rope", device="cpu"):
    torch.manual_seed(0)
    return build_model(scheme, 11, causal=True, d_model=16, n_heads=2, n_layers=2, max_len=64).to(device).train()


def batch(seed, n=12, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 11, (4, n + 1), generator=g)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device), {}


def test_decay_groups_decay_matrices_only_and_cover_every_parameter_once():
    model = tiny()
    decay, no_decay = decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert sorted(map(id, decay["params"] + no_decay["params"])) == sorted(map(id, model.parameters()))


def test_a_graphed_step_refuses_what_a_graph_cannot_replay_naming_the_argument():
    model = tiny()
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    capturable = torch.optim.AdamW(decay_groups(model, 0.0), lr=torch.tensor(1e-3), capturable=True)
    with pytest.raises(ValueError, match="dtype must be torch.bfloat16 or None"):
        GraphedStep(model, loss_fn, capturable, torch.float16, 1.0)
    with pytest.raises(ValueError, match="opt must keep its state and lr on the GPU"):
        GraphedStep(model, loss_fn, plain, None, 1.0)
    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        GraphedStep(model, loss_fn, capturable, None, 1.0, warmup=0)
    with pytest.raises(ValueError, match="max_graphs must be an int >= 0"):
        GraphedStep(model, loss_fn, capturable, None, 1.0, max_graphs=True)
    with pytest.raises(ValueError, match="needs a model on a CUDA device; its parameters are on cpu"):
        GraphedStep(model, loss_fn, capturable, None, 1.0)
    with pytest.raises(ValueError, match="capturable_adamw needs a model on a CUDA device"):
        capturable_adamw(model, 1e-3, 0.0)


def test_the_graph_probes_refuse_a_device_without_cuda_graphs():
    from posenc.bench.graphs import graph_costs
    from posenc.bench.workers import worker_scaling
    with pytest.raises(ValueError, match="graph_costs needs a CUDA device"):
        graph_costs(device="cpu")
    with pytest.raises(ValueError, match="graphed=True needs a CUDA device"):
        worker_scaling((1,), device="cpu", graphed=True)


def test_the_bench_skips_the_graph_probe_by_name_on_a_cpu(capsys):
    from posenc.bench.__main__ import run_sections            # not main(): it sets this process's thread count
    out = run_sections(["graphs"], "cpu", seq_len=16, rounds=1, clock="wall")
    assert out == {} and "== graphs: skipped (a CUDA benchmark)" in capsys.readouterr().out


def test_the_graph_decision_takes_the_aggregate_rate_at_the_most_workers_and_every_loss_gap():
    from posenc.bench.graphs import graph_decision
    single = [{"scheme": "nope", "loss_gap": 0.001}, {"scheme": "rope", "loss_gap": 0.004}]
    workers = [{"workers": 1, "step": "eager", "steps_per_s": 90.0}, {"workers": 10, "step": "eager", "steps_per_s": 460.0},
               {"workers": 1, "step": "graph", "steps_per_s": 400.0}, {"workers": 10, "step": "graph", "steps_per_s": 500.0}]
    ok, why = graph_decision(single, workers)
    assert not ok and "10 workers 460 -> 500 steps/s (1.09x)" in why      # 4.4x alone, not where the tier runs
    workers[-1]["steps_per_s"] = 1400.0
    assert graph_decision(single, workers)[0]
    single[1]["loss_gap"] = 0.05                                          # fast but training differently
    assert not graph_decision(single, workers)[0]
    single[1]["loss_gap"] = math.nan
    assert not graph_decision(single, workers)[0]
    with pytest.raises(ValueError, match="an eager and a graph row at 10 workers"):
        graph_decision(single, workers[:3])


def eager_steps(model, batches, lr=1e-2, loss=loss_fn):
    """The same steps eagerly, with the same (capturable) AdamW: only the graph differs."""
    opt = capturable_adamw(model, lr, 0.01)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    return [float(optimizer_step(model, loss, b, opt, scaler, None, 1.0)) for b in batches]


@pytest.fixture
def no_tf32(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def graphed_steps(model, batches, lr=1e-2, **kw):
    step = GraphedStep(model, loss_fn, capturable_adamw(model, lr, 0.01), None, 1.0, **kw)
    return [float(step(b)) for b in batches], step


@cuda
@pytest.mark.parametrize("scheme", ["nope", "rope", "alibi", "t5"])
def test_a_graphed_step_trains_as_the_eager_step_does(scheme, no_tf32):
    batches = [batch(s, device="cuda") for s in range(10)]
    eager, graphed = tiny(scheme, "cuda"), tiny(scheme, "cuda")
    want = eager_steps(eager, batches)
    got, step = graphed_steps(graphed, batches, warmup=3)
    assert step.captured == 1                              # steps 4-10 replayed one graph
    assert got == pytest.approx(want, rel=1e-4)
    for (name, a), b in zip(eager.named_parameters(), graphed.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name


@cuda
def test_each_shape_gets_its_own_graph_and_shapes_beyond_max_graphs_stay_eager(no_tf32):
    batches = [batch(s, n=12 if s % 3 else 20, device="cuda") for s in range(18)]
    want = eager_steps(tiny("rope", "cuda"), batches)
    got, step = graphed_steps(tiny("rope", "cuda"), batches, warmup=2)
    assert step.captured == 2 and got == pytest.approx(want, rel=1e-4)
    got, step = graphed_steps(tiny("rope", "cuda"), batches, warmup=2, max_graphs=0)
    assert step.captured == 0 and got == pytest.approx(want, rel=1e-4)


@cuda
def test_a_step_that_waits_on_the_gpu_is_found_before_its_capture_and_stays_eager(no_tf32):
    def waiting_loss(m, x, y, **kw):
        loss = loss_fn(m, x, y, **kw)
        return loss * (1.0 if float(loss) > 0 else 1.0)           # float(): reads the GPU on the host
    batches = [batch(s, device="cuda") for s in range(8)]
    want = eager_steps(tiny("rope", "cuda"), batches, loss=waiting_loss)
    model = tiny("rope", "cuda")
    step = GraphedStep(model, waiting_loss, capturable_adamw(model, 1e-2, 0.01), None, 1.0, warmup=2)
    got = [float(step(b)) for b in batches]
    assert step.captured == 0 and step.failed.startswith("the step waits on the GPU")
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert torch.cuda.get_sync_debug_mode() == 0
    assert got == pytest.approx(want, rel=1e-4)                   # the aborted attempt changed nothing


@cuda
def test_an_lr_tensor_off_the_models_device_is_refused():
    model = tiny("rope", "cuda")
    opt = torch.optim.AdamW(decay_groups(model, 0.0), lr=torch.tensor(1e-3), capturable=True)
    with pytest.raises(ValueError, match="lr tensors must be on the model's device"):
        GraphedStep(model, loss_fn, opt, None, 1.0)


@cuda
def test_set_lr_reaches_a_captured_graph_and_positions_are_refused(no_tf32):
    batches = [batch(s, device="cuda") for s in range(8)]
    eager, graphed = tiny("rope", "cuda"), tiny("rope", "cuda")
    opt = capturable_adamw(eager, 1e-2, 0.01)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    gopt = capturable_adamw(graphed, 1e-2, 0.01)
    step = GraphedStep(graphed, loss_fn, gopt, None, 1.0, warmup=1)
    for i, b in enumerate(batches):
        if i == 4:                                         # the graph was captured at step 1: the new rate must reach it
            set_lr(opt, 3e-4)
            set_lr(gopt, 3e-4)
        want, got = float(optimizer_step(eager, loss_fn, b, opt, scaler, None, 1.0)), float(step(b))
        assert got == pytest.approx(want, rel=1e-4), i
    assert step.captured == 1
    for a, b in zip(eager.parameters(), graphed.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    x, y, _ = batches[0]
    with pytest.raises(ValueError, match="takes no forward keywords"):
        step((x, y, {"positions": torch.arange(12)}))


# -- train() and the runner with --cuda-graphs ---------------------------------------------------------------

from posenc.runs.graphed import ENV, cached_tensors, graph_refusal, graphs_asked  # noqa: E402
from posenc.runs.train import TrainConfig, train  # noqa: E402
from posenc.tasks.synthetic import SyntheticTask  # noqa: E402

TASK = SyntheticTask("copy", train_length=6, n_symbols=8)


def cfg(**kw):
    return TrainConfig(**{"steps": 24, "batch_size": 8, "warmup": 4, "log_every": 6, "progress": False, **kw})


def fresh(scheme="rope", device="cpu"):
    torch.manual_seed(0)
    return build_model(scheme, TASK.vocab_size, causal=True, d_model=16, n_heads=2, n_layers=2, max_len=64).to(device)


@pytest.mark.parametrize("change, why", [
    ({"device": "cpu"}, "on cpu, not CUDA"),
    ({"dtype": torch.float16}, "fp16's loss scaling is read on the host"),
    ({"cfg": {"random_positions": 64}}, "randomized positions are drawn on the host"),
    ({"cfg": {"checkpoint_path": "ck.pt"}}, "a checkpoint keeps the scheduler"),
    ({"scheme": "floater"}, "Floater is not graph_safe"),
])
def test_graph_refusal_names_what_a_graph_cannot_replay(change, why):
    model = fresh(change.get("scheme", "rope"))
    device = torch.device(change.get("device", "cuda"))       # only compared: no GPU needed
    got = graph_refusal(model, cfg(**change.get("cfg", {})), device, change.get("dtype", torch.bfloat16))
    assert got is not None and why in got
    assert graph_refusal(fresh("rope"), cfg(), torch.device("cuda"), torch.bfloat16) is None


def test_graphs_asked_sets_the_variable_for_workers_and_restores_it(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with graphs_asked(True):
        assert os.environ[ENV] == "1"
        with graphs_asked(False):
            assert os.environ[ENV] == "0"
        assert os.environ[ENV] == "1"
    assert ENV not in os.environ


def test_asked_for_graphs_on_a_cpu_train_steps_eagerly_bit_for_bit():
    want = train(fresh(), TASK, cfg())
    with graphs_asked(True):
        got = train(fresh(), TASK, cfg())
    assert got.history == want.history and got.graphs == 0 and got.graph_error is None


def test_the_runner_records_what_cuda_graphs_did_to_each_run(tmp_path):
    from posenc.runs import RunSpec, Store, run_specs
    spec = RunSpec(scheme="rope", task="synthetic", task_kwargs={"name": "copy", "train_length": 6},
                   model={"d_model": 16, "n_heads": 2, "n_layers": 1, "causal": True},
                   train={"steps": 6, "batch_size": 4, "warmup": 2, "log_every": 3}, lengths=(6,), eval={"n_samples": 8})
    plain, asked = Store("ci", root=tmp_path / "plain"), Store("ci", root=tmp_path / "asked")
    run_specs([spec], plain, progress=False, device="cpu")
    with graphs_asked(True):
        run_specs([spec], asked, progress=False, device="cpu")
    assert "cuda_graphs" not in plain.get(spec)
    assert asked.get(spec)["cuda_graphs"] == {"trainings": 1, "graphs": 0, "eager_because": ["on cpu, not CUDA"]}
    assert asked.get(spec)["history"] == plain.get(spec)["history"]


def test_the_tensors_schemes_cache_are_found_so_a_graph_can_hold_them():
    x = torch.randint(0, TASK.vocab_size, (2, 12))
    for scheme in ("rope", "alibi"):
        model = fresh(scheme)
        assert cached_tensors(model) == []
        model(x)
        found = cached_tensors(model)
        assert found and all(isinstance(t, torch.Tensor) for t in found), scheme


@cuda
@pytest.mark.parametrize("scheme", ["nope", "rope", "alibi", "t5", "xl", "shaw", "kerple"])
def test_train_with_graphs_follows_the_eager_run_on_a_task_of_many_lengths(scheme, no_tf32):
    task = SyntheticTask("copy", train_length=8, min_train_length=5, n_symbols=8)   # four lengths, four graphs
    want = train(fresh(scheme, "cuda"), task, cfg(steps=40, amp="off"))
    with graphs_asked(True):
        got = train(fresh(scheme, "cuda"), task, cfg(steps=40, amp="off"))
    assert got.graph_error is None and got.graphs == 4
    assert [h["lr"] for h in got.history] == [h["lr"] for h in want.history]
    assert [h["loss"] for h in got.history] == pytest.approx([h["loss"] for h in want.history], rel=1e-3)
