"""The prepared GPU job (scripts/gpu_window.sh), rehearsed on the CPU in a throwaway copy of the repository.

A device is lent rarely and for 15 minutes: the job must end inside its call with the store packed, whether
the deadline stops the runner or the tier is done, and the copy's store must come back whole. The
rehearsal runs the real script with `--device cpu` and one chapter; only the training itself differs.
"""
import io
import json
import os
import random
import re
import shutil
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STORE = Path("results") / "full" / "runs"


@pytest.fixture
def repo(tmp_path):
    """posenc, scripts and the `full` store copied to a folder of their own (the store is the copy's)."""
    copy = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("posenc", "scripts"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    shutil.copytree(ROOT / STORE, copy / STORE)
    return copy


def window(repo: Path, **env) -> tuple[subprocess.CompletedProcess, float, Path]:
    out = repo / "out"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update({"OUT": str(out), "DEVICE": "cpu", "STACK": "0", "WORKERS": "1"}, **env)
    environ = {k: v for k, v in environ.items() if v is not None}          # WORKERS=None: the probe decides
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_window.sh"], cwd=repo, env=environ, capture_output=True, text=True,
                          timeout=300)
    return proc, time.monotonic() - t0, out


def probe_wheel(folder: Path) -> str:
    """A minimal pure-Python wheel (module posenc_probe) in `folder`, standing in for scripts/device_wheels.sh's."""
    name = "posenc_probe-0.1-py3-none-any.whl"
    info = "posenc_probe-0.1.dist-info"
    files = {"posenc_probe.py": "VALUE = 1\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: posenc-probe\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{info}/RECORD", "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]))
    return name


def packed(out: Path) -> list[str]:
    """The file names in the archive that came back as parts (store.tgz.0, .1, ...), joined in order."""
    parts = sorted(out.glob("store.tgz.*"), key=lambda p: int(p.suffix[1:]))
    assert parts, f"no archive parts in {sorted(p.name for p in out.iterdir())}"
    whole = out / "joined.tgz"
    whole.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(whole) as tar:
        names = [Path(m.name).name for m in tar.getmembers() if m.isfile()]
    whole.unlink()
    return names


def forget(repo: Path, specs) -> None:
    """Remove these specs' records (and weights) from the copy's store: its runs are missing there, whatever the
    repository's own store holds, so the rehearsals keep working once the real tier is complete."""
    for spec in specs:
        for suffix in (".json", ".pt"):
            (repo / STORE / f"{spec.key}{suffix}").unlink(missing_ok=True)


def unfinished(repo: Path, *, one_seed: bool = False) -> str:
    """A chapter with `full` runs missing in the copy, each of them minutes long on a CPU (so a 15 s deadline
    stops it): chapter 07's three seeds, forgotten there; or, `one_seed`, seed 0's alone (no group of seeds to
    stack among the missing runs)."""
    from posenc.runs.plans import plan
    forget(repo, [s for _, s in plan("07_t5", "full") if not one_seed or s.seed == 0])
    return "07_t5"


def startable(repo: Path, deadline: float) -> str:
    """A chapter with `full` runs missing in the copy whose shortest is estimated (on a CPU) to fit its first-job
    slack of `deadline`, and would take most of it: the runner starts it, and the deadline may stop it in flight.
    The runs of that size are forgotten in the copy."""
    from posenc.runs.costs import estimate_seconds
    from posenc.runs.execute import FIRST_JOB_SLACK
    from posenc.runs.plans import names, plan
    for chapter in names():
        fit = [s for _, s in plan(chapter, "full")
               if deadline / 2 <= estimate_seconds(s, "cpu") <= FIRST_JOB_SLACK * (deadline - 8)]   # 8 s: workers' start
        if fit:
            forget(repo, fit)
            return chapter
    raise AssertionError(f"no chapter has a full run that a {deadline} s deadline would start")


def test_a_window_that_reaches_its_deadline_stops_the_runner_and_brings_the_store_back(repo):
    """The runner starts what its first-job slack allows, stops at the deadline (a run in flight abandoned, or
    finished just in time), the runs it finished were re-packed every few seconds while it ran, and the final
    pack holds exactly the runs the log says were stored."""
    chapter = startable(repo, 40.0)
    proc, seconds, out = window(repo, CHAPTERS=chapter, DEADLINE="40", INTERIM_EVERY="4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert seconds < 40 + 60, f"the job took {seconds:.0f} s, past its budget (DEADLINE + 60 s)"
    log = (out / "runner.log").read_text()
    assert "steps/s in all" in log and re.search(r"[1-9]\d* (left for the next call|not started)", log), log
    assert re.search(r"[1-9]\d* runs stored|[1-9]\d* left for the next call", log), log   # a run did start
    assert "interim: " in log and "runner exit status: 0" in log, log              # re-packed while it ran
    listing = (out / "dry_run.txt").read_text()
    assert "== before" in listing and "== after" in listing and "cost model refitted" in listing, listing
    assert listing.count(chapter) == 4, listing            # cpu and cuda lines, before and after
    assert str(repo / STORE) in listing, listing                # the copy's posenc and store, never the checkout's
    stored = int(re.search(r"(\d+) runs stored", log).group(1))
    assert len([n for n in packed(out) if n.endswith(".json")]) == stored     # only the new runs travel back
    # 8 files come back at most; the final pack replaced the interim archive
    assert {p.name for p in out.iterdir()} == {"dry_run.txt", "runner.log", "store.tgz.0"}
    assert "cuda.json" not in {p.name for p in out.iterdir()}   # the cost table waits for a finished tier


def test_cuda_graphs_reach_the_runner_only_when_the_window_is_asked(repo):
    proc, _, out = window(repo, CHAPTERS=unfinished(repo), DEADLINE="10", CUDA_GRAPHS="1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--cuda-graphs: every run steps through CUDA graphs" in (out / "runner.log").read_text()
    proc, _, out = window(repo, CHAPTERS=unfinished(repo), DEADLINE="5")
    assert proc.returncode == 0 and "--cuda-graphs" not in (out / "runner.log").read_text()


def test_the_cost_script_runs_the_graph_probe_alone_when_asked_for_no_sections(repo, tmp_path):
    """`SECTIONS= bash scripts/gpu_costs.sh`: no cost table, only the graph tests and probe (here the bench
    refuses `--device cuda` by name, as on any machine without a GPU)."""
    out = tmp_path / "out"
    environ = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OUT": str(out), "SECTIONS": "",
               "LIMIT": "120"}
    proc = subprocess.run(["bash", "scripts/gpu_costs.sh"], cwd=repo, env=environ, capture_output=True, text=True,
                          timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {p.name for p in out.iterdir()}
    assert "bench.log" not in names and "graphs.log" in names, names
    assert "no CUDA device" in (out / "graphs.log").read_text()


def test_without_a_worker_count_the_window_measures_one_and_the_runner_uses_it(repo):
    """WORKERS unset: the worker probe (`posenc.bench --only workers`; on a CPU 1 and 2 processes for 2 s) times
    the aggregate step rate, and the runner takes the fewest workers within 5% of the best."""
    proc, _, out = window(repo, CHAPTERS=unfinished(repo), DEADLINE="10", WORKERS=None, PROBES="always")
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (out / "runner.log").read_text()
    assert "aggregate training steps/s of W processes" in log and "steps_per_s" in log, log[-2000:]
    chosen = [line for line in log.splitlines() if line.startswith("workers: ")]
    assert chosen and chosen[0].split()[1] in ("1", "2"), log[-2000:]
    assert "with 1 workers" in log or "with 2 workers" in log, log[-2000:]   # the runner's last line says so


def test_without_a_stacking_answer_the_window_reads_the_probe_and_refuses_a_nan_loss(repo, tmp_path):
    """STACK unset: the stacking probe's rows decide (`stack_decision`). The probe itself takes minutes on a CPU, so a
    stand-in for `timeout` writes the rows the 2026-12-04 H200 probe gave: faster (1.54x, 1.23x) but NaN losses."""
    nan = float("nan")
    rows = [{"scheme": "nope", "speedup": 1.542, "loss_gap": nan, "loss_single": 4.1, "loss_stacked": nan},
            {"scheme": "rope", "speedup": 1.233, "loss_gap": nan, "loss_single": 4.0, "loss_stacked": nan}]
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"machine": "cuda: NVIDIA H200", "sections": {"stacking": {"title": "", "rows": rows}}}))
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "timeout").write_text('#!/usr/bin/env bash\nfor a in "$@"; do [ "${prev:-}" = --save ] && cp %s "$a"; '
                                  'prev=$a; done\n' % probe)
    (shim / "timeout").chmod(0o755)
    proc, _, out = window(repo, CHAPTERS=unfinished(repo), DEADLINE="10", STACK=None, PROBES="always",
                          PATH=f"{shim}:{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (out / "runner.log").read_text()
    assert "stacking probe: median speedup 1.39x, largest loss gap nan (a final loss is NaN" in log, log[-2000:]
    assert "stack seeds: 0" in log, log[-2000:]


def test_probes_that_cannot_pay_are_skipped_and_the_deadline_follows_the_budget(repo):
    """With no stacked groups among the missing runs and a tier of under two minutes with ten workers (as since
    2026-12-04: 24 runs, about 0.7 min; here one of chapter 07's runs), both probes (up to 160 s) are skipped; without DEADLINE the
    runner's deadline is what is left of BUDGET less 60 s for packing, at most 400 s, and under 20 s the
    runner is not started."""
    proc, _, out = window(repo, CHAPTERS=unfinished(repo, one_seed=True), STACK=None, WORKERS=None, BUDGET="75")
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (out / "runner.log").read_text()
    assert "the stacking probe is skipped" in log and "stack seeds: 0" in log, log[-2000:]
    assert "the worker probe is skipped" in log and "workers: 10" in log, log[-2000:]
    assert "aggregate training steps/s" not in log                          # neither probe ran
    [line] = [x for x in log.splitlines() if x.startswith("deadline: ")]
    assert int(line.split()[1]) <= 15, line                                 # 75 s less what was spent, less 60
    assert "under 20 s left for the runner: it is not started" in log       # so short a runner could finish nothing
    assert (out / "dry_run.txt").exists()                                   # and the store is still listed and packed


def test_a_computed_deadline_starts_the_runner_and_the_job_ends_inside_its_budget(repo):
    proc, seconds, out = window(repo, CHAPTERS=unfinished(repo), BUDGET="100")
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (out / "runner.log").read_text()
    [line] = [x for x in log.splitlines() if x.startswith("deadline: ")]
    assert 20 <= int(line.split()[1]) <= 40, line
    assert "with 1 workers" in log and "runner: it is not started" not in log, log[-2000:]
    assert seconds < 100 + 15, f"the job took {seconds:.0f} s of a 100 s budget"
    packed(out)                                                        # the archive came back (maybe empty)


def test_a_bad_budget_is_refused_before_anything_runs(repo):
    proc, _, _ = window(repo, CHAPTERS=unfinished(repo), BUDGET="5.5")
    assert proc.returncode == 2 and "BUDGET must be whole seconds" in proc.stderr


def test_a_window_with_the_tier_done_packs_the_store_before_it_starts_the_cost_table(repo, tmp_path):
    wheel = probe_wheel(repo / ".whl")                           # carried reference libraries are installed first
    proc, seconds, out = window(repo, CHAPTERS="12_cnn_zero_padding", DEADLINE="15", BUDGET="200",
                                SITE=str(tmp_path / "site"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"carried wheels installed: {wheel}" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "site" / "posenc_probe.py").exists()
    assert "nothing to run" in (out / "runner.log").read_text()
    assert "the full tier is done" in proc.stdout, proc.stdout[-2000:]
    # On this CPU the cost table's benchmark refuses `--device cuda` by name; on a GPU it fills cuda.json.
    assert "no CUDA device" in (out / "bench.log").read_text()
    assert packed(out) == []                                    # the store came whole and goes back empty-handed
    assert seconds < 200


def test_the_runs_a_window_finished_come_back_in_parts_the_device_tool_can_carry(repo):
    """scripts/pack_new.sh packs the store's files that were not there when the call began, split into parts of at
    most PART bytes (the device tool brings back files of at most 16 MiB); joined, they give those files byte for
    byte, each run's weights before its record, so that an archive cut short holds whole runs."""
    store = repo / STORE
    listing = repo / "before.txt"
    listing.write_text("".join(f"{STORE / p.name}\n" for p in sorted(store.iterdir())))
    rng = random.Random(0)
    new = {}
    for key in ("00aa000000000000", "00ab000000000000", "ffee000000000000"):   # two runs with weights, one without
        new[f"{key}.json"] = b'{"key": "%s"}\n' % key.encode()
        if key != "00ab000000000000":
            new[f"{key}.pt"] = bytes(rng.getrandbits(8) for _ in range(6000))   # incompressible: several parts
    for name, data in new.items():
        (store / name).write_bytes(data)
    (store / ".ffee000000000000.pt.4242-x1.tmp").write_bytes(b"in flight")   # a run abandoned at the deadline
    out = repo / "out"
    out.mkdir()
    proc = subprocess.run(["bash", "scripts/pack_new.sh", str(listing), str(out)], cwd=repo, capture_output=True,
                          text=True, env={**os.environ, "PART": "4k"})
    assert proc.returncode == 0, proc.stderr
    assert "packed 3 new runs" in proc.stdout, proc.stdout
    parts = sorted(out.glob("store.tgz.*"))
    assert len(parts) >= 3 and all(p.stat().st_size <= 4096 for p in parts), [p.stat().st_size for p in parts]
    names = packed(out)
    assert sorted(names) == sorted(new)
    assert names.index("00aa000000000000.pt") < names.index("00aa000000000000.json")
    assert names.index("ffee000000000000.pt") < names.index("ffee000000000000.json")
    joined = b"".join(p.read_bytes() for p in sorted(parts, key=lambda p: int(p.suffix[1:])))
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        assert {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers()} == new
    # Back here: scripts/device_unpack.sh puts them into another checkout's store and sets their weights aside.
    here = repo.parent / "here"
    shutil.copytree(repo / "scripts", here / "scripts")
    (here / STORE).mkdir(parents=True)
    proc = subprocess.run(["bash", "scripts/device_unpack.sh", str(out)], cwd=here, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in (here / STORE).iterdir()} == {
        n: (b"" if n.endswith(".pt") else d) for n, d in new.items()}                  # weights: empty, aside
    assert {p.name: p.read_bytes() for p in (here / ".weights-aside" / STORE).iterdir()} == {
        n: d for n, d in new.items() if n.endswith(".pt")}


def archive(members: dict) -> bytes:
    """A tar.gz of {path: bytes}, in that order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def unpack(here: Path, files_at: Path) -> subprocess.CompletedProcess:
    (here / STORE).mkdir(parents=True, exist_ok=True)
    if not (here / "scripts").exists():
        shutil.copytree(ROOT / "scripts", here / "scripts")
    return subprocess.run(["bash", "scripts/device_unpack.sh", str(files_at)], cwd=here, capture_output=True,
                          text=True)


def test_a_call_that_brought_back_no_runs_still_copies_its_cost_table_and_sets_weights_aside(tmp_path):
    """The 2026-12-05 review: an empty archive (the tier already done, only the cost table ran) stopped the old
    script at `tar --wildcards` before it copied cuda.json."""
    files_at = tmp_path / "files"
    files_at.mkdir()
    (files_at / "store.tgz.0").write_bytes(archive({}))
    (files_at / "cuda.json").write_text('{"machine": "cuda: NVIDIA H100"}')
    here = tmp_path / "here"
    (here / "results" / "bench").mkdir(parents=True)
    proc = unpack(here, files_at)
    assert proc.returncode == 0, proc.stderr
    assert (here / "results" / "bench" / "cuda.json").read_text() == '{"machine": "cuda: NVIDIA H100"}'
    assert "0 file(s) written" in proc.stdout and "weights files set aside" in proc.stdout, proc.stdout
    assert list((here / STORE).iterdir()) == []


def test_an_archive_cut_short_gives_every_whole_run_before_the_cut_and_never_half_a_file(tmp_path):
    rng = random.Random(1)
    runs = {f"{STORE}/{k:016x}.{ext}": (bytes(rng.getrandbits(8) for _ in range(3000)) if ext == "pt"
                                        else b'{"key": "%016x"}\n' % k)
            for k in range(4) for ext in ("pt", "json")}
    whole = archive({**runs, "../../escape.json": b"{}", f"{STORE}/not-a-key.json": b"{}"})
    files_at = tmp_path / "files"
    files_at.mkdir()
    cut = len(whole) * 2 // 3
    (files_at / "store.tgz.0").write_bytes(whole[:cut // 2])
    (files_at / "store.tgz.1").write_bytes(whole[cut // 2:cut])          # the last part never came back
    here = tmp_path / "here"
    proc = unpack(here, files_at)
    assert proc.returncode == 0 and "read stopped" in proc.stdout, proc.stdout + proc.stderr
    got = {p.name for p in (here / STORE).iterdir()}
    assert got, "some whole runs came before the cut"
    for name in got:                                                  # every file written is whole
        data = runs[f"{STORE}/{name}"]
        assert (here / ".weights-aside" / STORE / name).read_bytes() == data if name.endswith(".pt") \
            else (here / STORE / name).read_bytes() == data
    assert len(got) < len(runs) and not (tmp_path / "escape.json").exists()
    # The interim archive of a call killed before its final pack: taken when no parts came.
    for p in files_at.iterdir():
        p.unlink()
    (files_at / "interim.tgz").write_bytes(whole)
    shutil.rmtree(here)
    proc = unpack(here, files_at)
    assert proc.returncode == 0 and "skipped" in proc.stdout, proc.stdout
    assert {p.name for p in (here / STORE).iterdir()} == {Path(n).name for n in runs}


def test_a_file_the_call_rewrote_in_place_goes_back_with_the_new_ones(repo, tmp_path):
    """A record that was there when the call began but was rewritten (corrupt, run again) is not in the
    listing's difference: STAMP, a file touched as the call began, finds it by its time."""
    store = repo / STORE
    old = store / "0123456789abcdef.json"
    old.write_text("{truncated")
    listing = repo / "before.txt"
    listing.write_text("".join(f"{STORE / p.name}\n" for p in sorted(store.iterdir())))
    stamp = tmp_path / "stamp"
    stamp.touch()
    os.utime(old, (time.time() - 100, time.time() - 100))          # written before the call began
    time.sleep(0.05)
    old.write_text('{"key": "0123456789abcdef"}')                  # run again during the call
    out = repo / "out"
    out.mkdir()
    run = lambda env: subprocess.run(["bash", "scripts/pack_new.sh", str(listing), str(out)], cwd=repo,
                                     capture_output=True, text=True, env={**os.environ, **env})
    assert run({}).returncode == 0 and packed(out) == []           # by path alone: missed
    for p in out.iterdir():
        p.unlink()
    assert run({"STAMP": str(stamp)}).returncode == 0 and packed(out) == ["0123456789abcdef.json"]


def test_the_weights_set_aside_for_a_device_call_come_back_byte_for_byte(tmp_path):
    """scripts/device_tree.sh: `aside` leaves an empty file for each weights file (the record stays whole for the
    runner), `back` restores every byte, and a second `aside` after a call's runs came back sets aside their weights
    too (the 2026-12-04 window's second call was refused: call 1's weights took the tree over 64 MiB)."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    weights = sorted((ROOT / "results").glob("*/runs/*.pt"))[:3]
    assert weights, "the store ships weights"
    for w in weights:
        (copy / w.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(w, copy / w.relative_to(ROOT))
    run = lambda verb: subprocess.run(["bash", "scripts/device_tree.sh", verb], cwd=copy, capture_output=True, text=True)
    assert run("aside").returncode == 0
    assert all((copy / w.relative_to(ROOT)).stat().st_size == 0 for w in weights)
    arrived = copy / "results" / "full" / "runs" / "0000000000000000.pt"      # a run unpacked from the call
    arrived.parent.mkdir(parents=True, exist_ok=True)
    arrived.write_bytes(weights[0].read_bytes())
    again = run("aside")
    assert again.returncode == 0 and "1 weights files" in again.stdout and arrived.stat().st_size == 0
    assert all((copy / w.relative_to(ROOT)).stat().st_size == 0 for w in weights)
    assert run("back").returncode == 0
    assert all((copy / w.relative_to(ROOT)).read_bytes() == w.read_bytes() for w in weights)
    assert arrived.read_bytes() == weights[0].read_bytes()
    assert not (copy / ".weights-aside").exists()
    if (ROOT / ".git").exists():                                # aside, they neither travel nor get committed
        ignored = subprocess.run(["git", "check-ignore", "-q", ".weights-aside/results/full/runs/0.pt"], cwd=ROOT)
        assert ignored.returncode == 0, ".weights-aside/ must be in .gitignore"
