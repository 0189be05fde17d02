"""The benchmark machinery (never timings): turn order, scheme kinds, matched reference sizes."""
import json

import pytest
import torch

import posenc
from posenc.bench import interleaved_times, machine
from posenc.bench.schemes import XT_OPTIONS, scheme_costs, scheme_kind, xtransformers_model


def test_interleaved_times_calls_in_turns_and_drops_warmup():
    calls = []
    times = interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, warmup=2)
    assert calls == ["a", "b"] * 5
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}


def test_rotated_rounds_start_with_each_function_in_turn_and_keep_round_order():
    calls = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    times = interleaved_times(fns, rounds=4, warmup=1, rotate=True)
    assert "".join(calls) == "abc" + "bca" + "cab" + "abc" + "bca"       # the warm-up round is round 0
    assert all(len(t) == 4 for t in times.values())


@pytest.mark.parametrize("kw, match", [({"clock": "gpu"}, "clock must be"), ({"rounds": 0}, "rounds must be")])
def test_interleaved_times_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        interleaved_times({"a": lambda: None}, **kw)


def test_scheme_kinds_follow_the_hooks_each_scheme_overrides():
    kinds = {name: scheme_kind(name) for name in posenc.SCHEMES}
    assert kinds["alibi"] == kinds["t5"] == "bias"
    assert kinds["rope"] == "q/k"
    assert kinds["shaw"] == kinds["xl"] == kinds["deberta"] == "custom"
    assert kinds["nope"] == kinds["learned"] == kinds["sinusoidal"] == "input"


@pytest.mark.parametrize("name", sorted(XT_OPTIONS))
def test_x_transformers_reference_has_our_sizes(name):
    """Same width, depth, heads and scheme: parameter counts agree to 2% (x-transformers adds a final norm)."""
    ours = posenc.build_model(name, 64, causal=True, max_len=256, d_model=128, n_heads=4, n_layers=2)
    ref = xtransformers_model(name, 64, seq_len=256, d_model=128, n_heads=4, n_layers=2)
    n_ours, n_ref = (sum(p.numel() for p in m.parameters()) for m in (ours, ref))
    assert abs(n_ours - n_ref) / n_ref < 0.02
    assert ref(torch.randint(0, 64, (1, 16))).shape == ours(torch.randint(0, 64, (1, 16))).shape


def test_scheme_costs_rows_are_relative_to_nope():
    rows = scheme_costs(["alibi", "shaw"], seq_len=16, batch_size=2, d_model=16, n_layers=1, rounds=1)
    assert rows.column("scheme") == ["nope", "nope (control)", "nope (unfused attention)", "alibi", "shaw"]
    assert rows[0]["train/nope"] == rows[0]["eval/nope"] == rows[0]["act/nope"] == 1
    shaw = rows.where(scheme="shaw")[0]
    assert shaw["act/nope"] > 1                                 # Shaw keeps its attention weights for backward
    unfused = rows.where(scheme="nope (unfused attention)")[0]
    assert unfused["kind"] == "input" and unfused["act/nope"] > 1   # the written-out softmax keeps its weights
    assert "cpu" in machine("cpu") and torch.__version__ in machine("cpu")


def test_every_rounds_time_is_kept_and_ratios_pair_by_round():
    """The best round gives `train_ms`; every round is kept in timing order, and `round_ratios` divides the two
    schemes' times round by round (the replicates of chapter 15's speed claims), never mixing rounds."""
    from posenc.bench.schemes import round_ratios
    rows = scheme_costs(["alibi"], seq_len=16, batch_size=2, d_model=16, n_layers=1, rounds=3)
    for r in rows:
        assert len(r["train_rounds_ms"]) == 3 and r["train_ms"] == min(r["train_rounds_ms"])
    fake = [{"scheme": "a", "train_rounds_ms": [2.0, 9.0, 4.0]}, {"scheme": "b", "train_rounds_ms": [1.0, 3.0, 4.0]}]
    assert round_ratios(fake, "a", "b") == {0: 2.0, 1: 3.0, 2: 1.0}
    with pytest.raises(ValueError, match="no row for scheme 'c'"):
        round_ratios(fake, "c", "b")
    with pytest.raises(ValueError, match="keeps no per-round times"):
        round_ratios([{"scheme": "a", "train_ms": 1.0}, fake[1]], "a", "b")
    with pytest.raises(ValueError, match="not one interleaved run"):
        round_ratios([fake[0], {"scheme": "b", "train_rounds_ms": [1.0]}], "a", "b")


def test_the_press_section_times_table_1s_schemes_over_enough_rounds(monkeypatch, capsys):
    """`--only press` times Press et al.'s four schemes (with NoPE and its controls) over at least PRESS_ROUNDS
    rounds whatever --rounds says, and prints no list column."""
    import posenc.bench.__main__ as bench
    seen = {}
    def fake(schemes, **kw):
        seen.update(schemes=schemes, rounds=kw["rounds"], rotate=kw["rotate"])
        return scheme_costs(["alibi"], seq_len=8, batch_size=2, d_model=16, n_layers=1, rounds=2)
    monkeypatch.setattr(bench, "scheme_costs", fake)
    out = bench.run_sections(["press"], "cpu", 16, 3, "wall")
    assert seen == {"schemes": bench.PRESS_SCHEMES, "rounds": bench.PRESS_ROUNDS, "rotate": True}
    assert f"{bench.PRESS_ROUNDS} rounds" in out["press"]["title"]
    assert bench.PRESS_ROUNDS % (len(bench.PRESS_SCHEMES) + 3) == 0     # every model first equally often
    assert [bench.press_rounds(r) for r in (1, 42, 43, 50)] == [42, 42, 49, 56]
    assert "train_rounds_ms" in out["press"]["rows"][0] and "train_rounds_ms" not in capsys.readouterr().out


def test_rope_benchmark_compares_like_with_like():
    """Each of our layouts returns exactly what the reference it is timed against returns."""
    from posenc.bench.kernels import ROPE_REFERENCE, rope_candidates
    fns = rope_candidates(seq=16, dim=8)
    q, k = torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
    for ours, ref in ROPE_REFERENCE.items():
        for a, b in zip(fns[ours](q, k), fns[ref](q, k)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


TINY = dict(d_model=16, n_heads=2, n_layers=1, batch_size=2)


def test_gpu_cost_table_code_runs_at_small_sizes_on_cpu():
    """The CUDA cost table's three tables, at CPU sizes: rows, reference columns and ratios to NoPE."""
    from posenc.bench.gpu import bias_backend_costs, gpu_scheme_costs, rope_llama_times
    costs = gpu_scheme_costs(["alibi", "t5"], seq_lens=(16, 32), sizes=TINY, rounds=1, device="cpu", dtype=None)
    assert costs.column("scheme") == ["nope", "nope (control)", "alibi", "t5"] * 2
    assert costs.column("seq") == [16] * 4 + [32] * 4
    assert all(r["train/nope"] == 1 for r in costs.where(scheme="nope")) and all(r["train_ms"] > 0 for r in costs)
    rope = rope_llama_times(seq_lens=(16,), heads=2, head_dim=8, rounds=1, device="cpu", dtype=torch.bfloat16)
    assert rope.where(candidate="floor: x * c")[0]["vs_floor"] == 1
    assert rope.where(candidate="ours half, compiled")[0]["vs_reference"] > 0
    bias = bias_backend_costs(("t5",), seq_lens=(16,), sizes=TINY, backends=("sdpa",), rounds=1, device="cpu",
                              dtype=None)
    assert bias.column("scheme") == ["nope", "t5 sdpa"]


def test_a_scheme_that_runs_out_of_memory_or_time_is_left_out_by_name_and_the_rest_are_timed(monkeypatch):
    """CoPE at 4096 tokens would need more than an H200's memory, FLOATER minutes: such a row says why it is
    empty, and the table still holds every other scheme (it once ended the whole cost table)."""
    import posenc.bench.gpu as gpu
    from posenc.schemes.alibi import ALiBi
    def too_big(self, ctx):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    monkeypatch.setattr(ALiBi, "logit_bias", too_big)
    costs = gpu.gpu_scheme_costs(["alibi", "t5"], seq_lens=(16,), sizes=TINY, rounds=1, device="cpu", dtype=None)
    [alibi] = costs.where(scheme="alibi")
    assert alibi["left_out"] == "out of memory" and alibi["train_ms"] is None and alibi["train/nope"] is None
    assert costs.where(scheme="t5")[0]["left_out"] is None and costs.where(scheme="t5")[0]["train/nope"] > 0
    monkeypatch.setattr(gpu, "SLOW_STEP_S", -1.0)              # every step too slow, NoPE's too: no ratios at all
    slow = gpu.gpu_scheme_costs(["t5"], seq_lens=(16,), sizes=TINY, rounds=1, device="cpu", dtype=None)
    assert all(r["left_out"].startswith("a step took") and r["train/nope"] is None for r in slow)


def test_models_that_fit_alone_but_not_together_are_timed_one_by_one(monkeypatch):
    """Each model passed its trial alone; if timing them in turns then runs out of memory, each is timed on its
    own, and one that still does not fit is left out by name."""
    import posenc.bench.gpu as gpu
    real = gpu.interleaved_times
    def crowded(fns, **kw):
        if len(fns) > 1 or "t5" in fns:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(fns, **kw)
    monkeypatch.setattr(gpu, "interleaved_times", crowded)
    costs = gpu.gpu_scheme_costs(["alibi", "t5"], seq_lens=(16,), sizes=TINY, rounds=1, device="cpu", dtype=None)
    assert costs.where(scheme="alibi")[0]["train/nope"] > 0 and costs.where(scheme="alibi")[0]["left_out"] is None
    assert costs.where(scheme="t5")[0]["left_out"] == "out of memory" and costs.where(scheme="t5")[0]["train_ms"] is None


def test_a_section_made_of_tables_in_turn_keeps_each_as_it_is_made():
    """The gpu section saves its RoPE table before the bias table is made, and so on: a window that ends in
    the middle keeps what it finished."""
    from posenc.bench.__main__ import run_section
    saved = []
    def fails():
        raise RuntimeError("the window ended")
    out = {}
    with pytest.raises(RuntimeError, match="the window ended"):
        run_section("gpu", "t", {"rope": lambda: posenc.Table([{"a": 1}]), "bias": fails}, out,
                    lambda o: saved.append(json.loads(json.dumps(o))))
    assert saved == [{"gpu": {"title": "t", "rows": {"rope": [{"a": 1}]}}}]


def test_clear_cache_drops_what_a_scheme_keeps_between_steps():
    """clear_cache drops ALiBi's kept [H, n, n] bias and RoPE's tables, so that a step measured after it builds
    them again (`peak_bytes(forget=...)`), as T5 builds its bias at every step."""
    model = posenc.build_model("alibi", 11, causal=True, d_model=16, n_heads=2, n_layers=1, max_len=32)
    model(torch.randint(0, 11, (1, 8)))
    assert model.scheme._last is not None
    model.scheme.clear_cache()
    assert model.scheme._last is None
    rope = posenc.build_model("rope", 11, causal=True, d_model=16, n_heads=2, n_layers=1, max_len=32)
    rope(torch.randint(0, 11, (1, 8)))
    assert rope.scheme._cache
    rope.scheme.clear_cache()
    assert not rope.scheme._cache
    posenc.build_model("t5", 11, causal=True, d_model=16, n_heads=2, n_layers=1, max_len=32).scheme.clear_cache()


def test_rope_candidates_agree_in_bf16():
    """At the cost table's dtype every layout still returns what its reference returns (to bf16 rounding)."""
    from posenc.bench.kernels import ROPE_REFERENCE, rope_candidates
    fns = rope_candidates(seq=16, dim=8, dtype=torch.bfloat16)
    q, k = (torch.randn(2, 3, 16, 8).bfloat16() for _ in range(2))
    for ours, ref in ROPE_REFERENCE.items():
        for a, b in zip(fns[ours](q, k), fns[ref](q, k)):
            assert a.dtype == torch.bfloat16
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_the_rope_table_leaves_out_rotary_embedding_torch_by_name_where_it_is_missing(monkeypatch):
    """The GPU image has transformers but not rotary-embedding-torch: the table keeps every other row."""
    import sys
    from posenc.bench.gpu import rope_llama_times
    monkeypatch.setitem(sys.modules, "rotary_embedding_torch", None)    # `import` now raises ImportError
    with pytest.warns(UserWarning, match="rotary-embedding-torch is not installed"):
        rope = rope_llama_times(seq_lens=(16,), heads=2, head_dim=8, rounds=1, device="cpu", dtype=torch.bfloat16)
    assert rope.column("candidate") == ["ours half", "ours half, compiled", "transformers LLaMA (half)",
                                        "ours interleaved", "floor: x * c"]
    assert rope.where(candidate="ours interleaved")[0]["vs_reference"] is None
    assert rope.where(candidate="ours half")[0]["vs_reference"] > 0


def test_the_gpu_section_is_skipped_on_cpu(capsys):
    from posenc.bench.__main__ import run_sections
    assert run_sections(["gpu"], "cpu", 16, 1, "wall") == {}
    assert "skipped (a CUDA benchmark)" in capsys.readouterr().out


def test_the_xt_section_is_skipped_by_name_where_x_transformers_is_missing(capsys, monkeypatch):
    import importlib.util
    from posenc.bench.__main__ import run_sections
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "x_transformers" else real(name, *a))
    assert run_sections(["xt"], "cpu", 16, 1, "wall") == {}            # the GPU image has no x-transformers
    assert "skipped (x-transformers is not installed" in capsys.readouterr().out


def test_save_writes_a_new_file_and_merges_sections_of_the_same_machine(tmp_path):
    from posenc.bench.__main__ import save
    path = tmp_path / "new" / "bench.json"
    save({"machine": "m1", "sections": {"a": 1}}, path)
    assert json.loads(path.read_text()) == {"machine": "m1", "sections": {"a": 1}}
    save({"machine": "m1", "sections": {"b": 2}}, path)
    assert json.loads(path.read_text())["sections"] == {"a": 1, "b": 2}
    save({"machine": "m2", "sections": {"c": 3}}, path)
    assert json.loads(path.read_text())["sections"] == {"c": 3}
    whole = {"title": "t", "rows": {"rope": [1], "bias": [2], "schemes": [3]}}
    save({"machine": "m2", "sections": {"gpu": whole}}, path)
    save({"machine": "m2", "sections": {"gpu": {"title": "t", "rows": {"rope": [9]}}}}, path)   # a window cut short
    assert json.loads(path.read_text())["sections"]["gpu"]["rows"] == {"rope": [9], "bias": [2], "schemes": [3]}


@pytest.mark.parametrize("target, match", [("/proc/posenc-bench.json", "cannot create files"), ("bad.json", "no valid JSON")])
def test_an_unusable_save_target_is_refused_before_the_benchmark_runs(tmp_path, monkeypatch, target, match, capsys):
    from posenc.bench.__main__ import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("not json")
    ran = []
    monkeypatch.setattr("posenc.bench.__main__.run_sections", lambda *a: ran.append(a) or {})
    with pytest.raises(SystemExit):
        main(["--only", "rope", "--save", target])
    assert not ran and match in capsys.readouterr().err


@pytest.mark.parametrize("device, match", [("gpu", "--device: device must be"), ("cuda", "no CUDA device")])
def test_an_unusable_device_is_refused_by_name(monkeypatch, device, match, capsys):
    from posenc.bench.__main__ import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ran = []
    monkeypatch.setattr("posenc.bench.__main__.run_sections", lambda *a: ran.append(a) or {})
    with pytest.raises(SystemExit):
        main(["--only", "rope", "--device", device])
    assert not ran and match in capsys.readouterr().err


@pytest.mark.parametrize("option, value", [("--seq-len", "0"), ("--seq-len", "-3"), ("--threads", "0"),
                                           ("--threads", "-2"), ("--rounds", "0"), ("--rounds", "x")])
def test_a_size_that_is_not_a_positive_int_is_refused_by_its_option(monkeypatch, capsys, option, value):
    """--seq-len 0 had ended in "max_len must be a positive int" (the wrong name), -3 in a negative-dimension
    RuntimeError, --threads 0 in set_num_threads' traceback; now argparse names the option, before running."""
    from posenc.bench.__main__ import main
    ran = []
    monkeypatch.setattr("posenc.bench.__main__.run_sections", lambda *a: ran.append(a) or {})
    with pytest.raises(SystemExit):
        main(["--only", "rope", option, value])
    assert not ran and f"argument {option}: must be a positive int" in capsys.readouterr().err


def test_stored_section_takes_the_first_device_whose_table_holds_it(tmp_path):
    from posenc.bench.stored import stored_bench, stored_section
    (tmp_path / "cpu.json").write_text(json.dumps({"machine": "cpu: m", "sections": {
        "schemes": {"title": "t cpu", "rows": [{"scheme": "nope"}]}, "xt": {"title": "x", "rows": []}}}))
    assert stored_bench("cuda", tmp_path) is None and stored_section("gpu", ("cuda", "cpu"), tmp_path) is None
    (tmp_path / "cuda.json").write_text(json.dumps({"machine": "cuda: H200", "sections": {
        "schemes": {"title": "t cuda", "rows": []}, "gpu": {"title": "g", "rows": {}}}}))
    assert stored_section("schemes", ("cuda", "cpu"), tmp_path)["machine"] == "cuda: H200"
    assert stored_section("xt", ("cuda", "cpu"), tmp_path) == {"device": "cpu", "machine": "cpu: m", "title": "x",
                                                               "rows": []}   # the GPU image may lack x-transformers
    assert stored_section("schemes", ("cpu",), tmp_path)["title"] == "t cpu"
    with pytest.raises(ValueError, match="device must be one of"):
        stored_bench("tpu", tmp_path)


def test_cuda_summary_widens_the_scheme_table_and_judges_each_goal():
    from posenc.bench.stored import cuda_summary
    schemes = [{"scheme": s, "seq": n, "train_ms": 1.0, "train/nope": t, "peak_MiB": 1.0, "peak/nope": m}
               for n in (1024, 4096) for s, t, m in (("nope", 1.0, 1.0), ("t5", 1.3 if n == 1024 else 1.6, 2.0))]
    rope = [{"seq": 2048, "candidate": c, "ms": 1.0, "vs_floor": f, "vs_reference": None}
            for c, f in (("ours half", 1.4), ("ours interleaved", 1.7), ("transformers LLaMA (half)", 3.0),
                         ("floor: x * c", 1.0))]
    bias = [{"scheme": s, "seq": 4096, "train_ms": 1.0, "train/nope": 1.0, "peak_MiB": 1.0, "peak/nope": m}
            for s, m in (("nope", 1.0), ("t5 flex", 1.08), ("alibi flex", 1.2), ("t5 sdpa", 3.0), ("x flex", None))]
    out = cuda_summary({"schemes": schemes, "rope": rope, "bias": bias})
    assert list(out["schemes"]) == [
        {"scheme": "nope", "step/nope @1024": 1.0, "peak/nope @1024": 1.0, "step/nope @4096": 1.0, "peak/nope @4096": 1.0},
        {"scheme": "t5", "step/nope @1024": 1.3, "peak/nope @1024": 2.0, "step/nope @4096": 1.6, "peak/nope @4096": 2.0}]
    assert out["rope"].column("goal") == [True, False, None, None]       # 1.5x the floor, our rows only
    assert out["bias"].column("goal") == [None, True, False, None, None]  # 1.1x NoPE's peak, flex rows with a peak
    partial = cuda_summary({"rope": rope})                                 # a window that ended after the first table
    assert list(partial) == ["rope"]
    left = [{**r, "left_out": "out of memory" if r["scheme"] == "t5" and r["seq"] == 4096 else None,
             **({"train/nope": None, "peak/nope": None} if r["scheme"] == "t5" and r["seq"] == 4096 else {})}
            for r in schemes]
    assert cuda_summary({"schemes": left})["schemes"][1]["left out"] == "@4096: out of memory"


def test_floater_cost_rows_hold_every_timing_and_its_ratio():
    from posenc.bench.floater import floater_cost
    rows = floater_cost(lengths=(16, 32), dim=16, layers=1, repeats=1)
    assert rows.column("positions") == [16, 32]
    for r in rows:
        assert all(r[k] > 0 for k in ("sinusoidal_ms", "floater_ms", "cached_ms", "floater_fwd_bwd_ms"))
        assert r["floater/sin"] == pytest.approx(r["floater_ms"] / r["sinusoidal_ms"])
    assert "floater_fwd_bwd_ms" not in floater_cost(lengths=(8,), dim=8, layers=1, repeats=1, backward=False)[0]
    with pytest.raises(ValueError, match="clock"):
        floater_cost(clock="sundial")


def test_the_worker_probe_times_each_count_and_picks_the_fewest_within_reach_of_the_best():
    """posenc.bench.workers: W spawned processes step the same model after a barrier; the aggregate rate is the
    sum of theirs. On two CPU cores two workers do more steps in all than one (each has a core)."""
    from posenc.bench.workers import best_count, worker_scaling
    rows = worker_scaling((1, 2), seconds=1.5, d_model=16, n_heads=2, n_layers=1, batch_size=2, seq_len=16,
                          device="cpu")
    assert [r["workers"] for r in rows] == [1, 2]
    assert all(r["steps_per_s"] > 0 and r["per_worker"] == pytest.approx(r["steps_per_s"] / r["workers"]) for r in rows)
    assert rows[0]["vs_one"] == 1 and rows[1]["vs_one"] == pytest.approx(rows[1]["steps_per_s"] / rows[0]["steps_per_s"])
    table = [{"workers": 1, "steps_per_s": 85.0}, {"workers": 6, "steps_per_s": 190.0},
             {"workers": 10, "steps_per_s": 178.6}, {"workers": 16, "steps_per_s": 195.0}]
    assert best_count(table) == 6                          # 190 is within 5% of 195: fewer processes, same rate
    assert best_count(table, within=0.0) == 16
    with pytest.raises(ValueError, match="counts"):
        worker_scaling((0,))
    with pytest.raises(ValueError, match="seconds"):
        worker_scaling((1,), seconds=0)
