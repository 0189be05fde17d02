"""`ensure`: the records of some specs, running only the missing ones; `Runs`: a chapter's view of them."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ..book import glue
from ..table import Table
from .execute import default_workers, run_specs
from .spec import RunSpec
from .store import PROFILES, Record, Store, results_root


def _unique(specs: Iterable[RunSpec]) -> list[RunSpec]:
    specs = list(specs)
    bad = [s for s in specs if not isinstance(s, RunSpec)]
    if bad:
        raise TypeError(f"specs must be RunSpec objects; got {type(bad[0]).__name__}")
    return list({s.key: s for s in specs}.values())


def missing(specs, profile: str = "ci", *, store: Store | None = None) -> list[RunSpec]:
    """The specs that have no readable record yet."""
    store = store or Store(profile)
    return [s for s in _unique(specs) if store.get(s) is None]


def ensure(specs, profile: str | None = None, *, store: Store | None = None, load_only: bool = False,
           workers: int | None = None, device: str = "auto", progress: bool = True) -> list[Record]:
    """The records of `specs` (in order), running the missing ones first.

    Any setting that differs makes another key, so a stored record is only ever reused
    for exactly its spec. Missing runs are each stored the moment they end.

    Args:
        specs: a list of `RunSpec` (a spec listed twice is run once).
        profile: the store's tier, "ci", "paper" or "full" (`results/<profile>/runs/`); by default
            `store`'s tier, else "ci".
        store: another `Store` (e.g. one in a temporary folder) instead of the profile's; its tier must
            be `profile` when both are given.
        load_only: raise LookupError instead of running what is missing.
        workers: processes for the missing runs (default `default_workers`: one per core on the CPU,
            ten per GPU but never more than the cores; in this process when one run is missing).
        device: "auto" (CUDA if present), "cpu" or "cuda".
        progress: show a progress bar.
    """
    if store is not None and not isinstance(store, Store):
        raise TypeError(f"store must be a posenc.runs.Store, e.g. Store({profile!r}, root=folder); "
                        f"got {type(store).__name__}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int or None (one per core); got {workers!r}")
    if store is not None and profile is not None and profile != store.profile:
        raise ValueError(f"profile={profile!r} but store is {store!r}: give one of them, or the same tier")
    store = store or Store(profile or "ci")
    specs = list(specs)
    todo = missing(specs, store=store)
    if todo and load_only:
        raise LookupError(f"{len(todo)} of {len(_unique(specs))} runs have no record in {store.folder}; "
                          f"run them with: python -m posenc.runs --profile {store.profile}")
    if todo:
        n = workers or (1 if len(todo) == 1 else min(len(todo), default_workers(device)))
        out = run_specs(todo, store, workers=n, device=device, progress=progress, desc=f"{store.profile} runs")
        if out["failed"]:
            key, error = next(iter(out["failed"].items()))
            raise RuntimeError(f"{len(out['failed'])} runs failed; first: {key}: {error}")
    records = [r for r in (store.get(s) for s in specs) if r is not None]
    if len(records) < len(specs):
        raise RuntimeError(f"runs finished but some records are unreadable in {store.folder}")
    return records


def stored(specs, profile: str) -> list[Record] | None:
    """The committed records of `specs` for `profile`, or None unless every one is stored."""
    store, specs = Store(profile), list(specs)
    records = [r for r in (store.get(s) for s in specs) if r is not None]
    return None if len(records) < len(specs) else records


def tier_count(name: str, profile: str) -> tuple[int, int]:
    """(runs stored, runs declared) of chapter `name`'s `profile` tier in `Store(profile)` (the committed store,
    or the test run's for `ci`); (0, 0) for a tier the chapter does not declare. Reads the store only."""
    from .plans import plan
    specs = _unique(s for _, s in plan(name, profile))
    return len(specs) - len(missing(specs, profile)), len(specs)


def so_far(name: str, profile: str = "full", *, store: Store | None = None) -> Runs | None:
    """The runs of chapter `name`'s `profile` stored so far, complete or not; None when none is stored.

    For a tier that GPU windows fill a part at a time: a chapter shows its largest complete tier
    (`chapter`) and this one beside it, before its last runs land. `runs.missing` holds the labels
    of the specs not stored yet; `status()` names them. Reads the store only; trains nothing.
    """
    from .plans import plan
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}; got {profile!r}")
    if store is not None and not isinstance(store, Store):
        raise TypeError(f"store must be a posenc.runs.Store; got {type(store).__name__}")
    store = store or Store(profile)
    found = [(label, spec, store.get(spec)) for label, spec in plan(name, profile)]
    kept = [(label, spec) for label, spec, record in found if record is not None]
    if not kept:
        return None
    return Runs(name, profile, kept, [record for *_, record in found if record is not None],
                missing=[label for label, _, record in found if record is None])


def in_words(labels) -> str:
    """Run labels in words, seeds counted: "scheme=rope (randomized), task=lm (3 seeds); ..."."""
    from collections import Counter
    groups = Counter(tuple((k, v) for k, v in label.items() if k != "seed") for label in labels)
    return "; ".join(f"{', '.join(f'{k}={v}' for k, v in group) or 'every run'}"
                     f" ({n} seed{'s' if n != 1 else ''})" for group, n in groups.items())


def made(records, seeds=()) -> str:
    """What a set of records is, in words: "173 runs on CPU, seeds 0, 1, 2, 3, 4"."""
    records, seeds = list(records), sorted(set(seeds))
    devices = sorted({r.get("machine", "?").split(":")[0].upper() for r in records})
    return (f"{len(records)} run{'s' if len(records) != 1 else ''} on {'/'.join(devices)}"
            + (f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}" if seeds else ""))


class Runs:
    """The records of one chapter's plan, with the labels the chapter gave each spec::

        runs = posenc.runs.chapter("02_sinusoidal", profile)  # runs any missing
        runs.profile            # "ci", "paper" or "full": the tier shown
        runs.rows(task="lm")    # labelled evaluation rows

    `rows`, `histories`, `record`, `spec` and `model` pick runs by their labels (`select`).
    """

    def __init__(self, name: str, profile: str, labelled: list[tuple[dict, RunSpec]], records: list[Record],
                 *, missing: Sequence[dict] = ()):
        self.name, self.profile = name, profile
        self.labels = [label for label, _ in labelled]
        self.records = records
        self.missing = list(missing)            # labels of the plan's runs not stored yet (`so_far`)

    def __len__(self) -> int:
        return len(self.records)

    def select(self, **where) -> list[tuple[dict, Record]]:
        """(label, record) pairs whose label has every `where` key equal to its value."""
        return [(lab, rec) for lab, rec in zip(self.labels, self.records)
                if all(lab.get(k) == v for k, v in where.items())]

    def rows(self, **where) -> Table:
        """Every evaluation row of the selected runs, each with its run's label columns first."""
        return Table(row for lab, rec in self.select(**where) for row in rec.rows(**lab))

    def record(self, **where) -> Record:
        """The one record whose label matches `where` (a ValueError names the count otherwise)."""
        found = self.select(**where)
        if len(found) != 1:
            raise ValueError(f"{len(found)} runs of {self.name} match {where}; labels look like {self.labels[:2]}")
        return found[0][1]

    def spec(self, **where) -> RunSpec:
        """The spec of the one run whose label matches `where`."""
        return self.record(**where).spec

    def histories(self, by: str, **where) -> dict:
        """{label[by]: history} for the selected runs (the first run of each value of `by`)."""
        out: dict = {}
        for lab, rec in self.select(**where):
            out.setdefault(lab[by], rec.history)
        return out

    def model(self, **where) -> torch.nn.Module:
        """The trained model of one run (declared with keep_weights=True), rebuilt and loaded."""
        from .recipes import build_untrained
        rec = self.record(**where)
        torch.manual_seed(0)
        model = build_untrained(rec.spec)
        model.load_state_dict(rec.state_dict())
        return model.eval()

    def status(self) -> str:
        """One sentence: which profile the numbers come from, and how to make the larger ones.

        The `ci` profile is what nbval recomputes on two CPU cores; `paper` (CPU, hours) and
        `full` (one GPU) are stored by the runner and shown when every run of the chapter is there.
        """
        scale = {"ci": "the quick `ci` profile", "paper": "the CPU `paper` profile",
                 "full": "the GPU `full` profile"}[self.profile]
        more = self._larger_tiers()
        from .execute import code_version
        now = code_version()["posenc"]
        older = sorted({f"posenc {v['posenc']}" for r in self.records
                        if (v := r.get("version") or {}).get("posenc") != now})
        stale = (f" Made by older code ({', '.join(older)}), kept because their specs, which hash every setting, "
                 "are unchanged." if older else "")
        if self.missing:
            n = len(self.missing)
            return (f"Numbers from {scale}, so far: {self.made()}.{stale} Not stored yet: {n} run{'s' if n != 1 else ''}"
                    f", {in_words(self.missing)} (`python -m posenc.runs --profile {self.profile} --chapters {self.name}`).")
        return f"Numbers from {scale}: {self.made()}.{stale}{more}"

    def _larger_tiers(self) -> str:
        """The tiers above this one that the chapter declares, by how much of each the store holds:
        " Stored in part: `full`, 171 of 180 runs (`python -m posenc.runs --profile full --chapters ...`)."."""
        groups: dict[str, list[str]] = {"Not stored yet": [], "Stored in part": [], "Also stored": []}
        todo = None
        for p in PROFILES[PROFILES.index(self.profile) + 1:]:
            done, declared = tier_count(self.name, p)
            if not declared:
                continue
            head = "Not stored yet" if not done else "Stored in part" if done < declared else "Also stored"
            groups[head].append(f"`{p}`" + (f", {done} of {declared} runs" if head == "Stored in part" else ""))
            todo = (head, p) if done < declared else todo
        said = {head: " and ".join(tiers) for head, tiers in groups.items() if tiers}
        if todo:
            said[todo[0]] += f" (`python -m posenc.runs --profile {todo[1]} --chapters {self.name}`)"
        return "".join(f" {head}: {text}." for head, text in said.items())

    def made(self) -> str:
        """These runs in words: how many, on which device, which seeds (`posenc.runs.ensure.made`)."""
        return made(self.records, (lab["seed"] for lab in self.labels if "seed" in lab))

    def key_result(self, *sentences: str, name: str = "key_result", paper: tuple = ()):
        """The chapter's key result: its sentences and `status()`, glued as Markdown under `name`.

        When this tier is not the one that decides the book's claims, a sentence after the chapter's own
        names each claim whose verdict differs there (`posenc.runs.profiles.disagreements`), so the box at
        the top of the page never gives a verdict the deciding tier overturns without saying so.

        `paper` names, in words (e.g. "the LM of every scheme (173 runs on CPU, seeds 0, 1, 2, 3, 4)"),
        the paper-tier records that sentences of a chapter whose own runs are `ci` also quote, so the
        note under the box does not give the `ci` runs as the source of every number. A chapter calls
        it once its verdicts are computed; the box at the top of the page shows the glued text
        (myst-nb's `glue:md`). Returns the text as a `KeyResult`, which a notebook (Colab's included) shows
        formatted.
        """
        if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
            raise ValueError("sentences must be one or more non-empty strings")
        if isinstance(paper, str) or not all(isinstance(p, str) and p.strip() for p in paper):
            raise TypeError("paper must be a tuple of non-empty strings (one per paper-tier source)")
        from .profiles import disagreements
        differ = disagreements(self.name, self.profile)
        sentences = sentences + ((differ,) if differ else ())
        note = self.status() + (f" The sentences on the paper tier read the CPU `paper` profile: "
                                f"{'; '.join(paper)}." if paper else "")
        text = KeyResult(" ".join(s.strip() for s in sentences) + "\n\n*" + note + "*")
        try:
            from IPython.display import Markdown
        except ImportError:
            return text
        glue(name, Markdown(text))
        return text


class KeyResult(str):
    """A key result's Markdown: a str that a notebook shows formatted, as the box at the top of the book's
    page does (on Colab, where there is no page, the cell that computes it is where a reader sees it)."""

    def _repr_markdown_(self) -> str:
        return str(self)


def chapter(name: str, profile: str = "auto", *, workers: int | None = None, progress: bool = False,
            load_only: bool = False) -> Runs:
    """A chapter's runs: the largest profile stored in full (full, then paper), else `ci`, run as needed.

    `profile="auto"` on a CUDA machine runs `full` where the chapter declares a `full` tier (chapter 10
    decides its claims at `paper` and has none); an explicit profile runs that one.
    load_only=True reads the committed store (never the test run's) and runs nothing: for
    sweeps too large to recompute under the tests. With `profile="auto"` it shows the largest
    tier stored in full on any machine: a chapter that trains nothing has no use for the GPU,
    and on one it would otherwise ask for a `full` tier that a GPU window has not finished.
    """
    from .plans import plan
    if profile not in ("auto",) + PROFILES:
        raise ValueError(f"profile must be 'auto' or one of {PROFILES}; got {profile!r}")
    if profile == "auto":
        if torch.cuda.is_available() and not load_only and plan(name, "full"):
            profile = "full"
        else:
            for p in ("full", "paper"):
                if (runs := so_far(name, p)) is not None and not runs.missing:
                    return runs
            profile = "ci"
    labelled = plan(name, profile)
    if not labelled:
        tiers = [p for p in PROFILES if plan(name, p)]
        raise ValueError(f"chapter {name!r} declares no {profile!r} runs; its tiers: {', '.join(tiers) or 'none'}")
    store = Store(profile, results_root()) if load_only else None
    records = ensure([s for _, s in labelled], profile, store=store, load_only=load_only, workers=workers,
                     progress=progress)
    return Runs(name, profile, labelled, records)
