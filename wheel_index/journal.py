"""What makes a killed publish whole again on the next run.

Each file is written atomically (a temporary name then a rename; one PUT on
S3), but a view is several files (index.html, index.json, metadata.json, the
root pages) and a publish writes several views: a publish killed between two
of them leaves a view whose pages disagree. So, under the index lock, a
publish records what it is about to render (the journal, `.publish-journal.json`)
before its first page and deletes it after its last. Every publish and prune
starts, under the same lock, by removing the temporaries killed writers left
and, when a journal is there, rendering its views again from the stored entry
records (which are complete: each is written after its wheel and metadata),
so the pages of a killed publish end all old or all new.

A publish killed while it stores wheels leaves no journal: its entries are not
shown by any page until a publish of that commit runs again.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from packaging.version import InvalidVersion, Version

from tools.errors import UserError
from wheel_index.documents import check_commit, check_variant, parse_json_object
from wheel_index.levels import Level, write_views
from wheel_index.per_variant_level import PerVariantLevel
from wheel_index.storage import Storage
from wheel_index.variants_level import VariantsLevel

JOURNAL = ".publish-journal.json"


@dataclass
class PublishResult:
    stored: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    pages_written: list[str] = field(default_factory=list)
    nightly_moved: dict[str, bool] = field(default_factory=dict)
    nightly_kept: dict[str, list[str]] = field(default_factory=dict)  # why -> levels
    variants: PublishResult | None = None  # what the variants level did, kept apart


@dataclass
class Plan:
    """The views one publish renders: its commit's, and nightly's or a release's."""
    commit: str
    commit_time: int
    variants: list[str]    # per-variant levels
    variants_level: bool   # and the variants level
    nightly: bool
    release_version: str | None
    allow_rewind: bool

    @classmethod
    def from_json(cls, data: bytes) -> Plan:
        doc = parse_json_object(data, JOURNAL)
        try:
            plan = cls(**doc)
        except TypeError:
            raise UserError(f"{JOURNAL}: not a publish journal") from None
        check_commit(plan.commit, JOURNAL)
        for v in plan.variants if isinstance(plan.variants, list) else [None]:
            check_variant(v, JOURNAL)
        release = plan.release_version
        if not isinstance(plan.commit_time, int) or not isinstance(release, (str, type(None))):
            raise UserError(f"{JOURNAL}: not a publish journal")
        if release is not None:  # it names a folder: a normalized version, nothing else
            try:
                if str(Version(release)) != release:
                    raise InvalidVersion(release)
            except InvalidVersion:
                raise UserError(f"{JOURNAL}: release {release[:40]!r} is not a version") from None
        return plan


def write_pages(storage: Storage, plan: Plan, log, result) -> None:
    """Render the plan's views; result.variants takes the variants level's."""
    storage.write_atomic(JOURNAL, json.dumps(asdict(plan), indent=1).encode())
    levels: list[tuple[Level, PublishResult | None]] = [
        (PerVariantLevel(plan.commit, v), result) for v in plan.variants]
    if plan.variants_level:
        levels.append((VariantsLevel(plan.commit), result.variants))
    for level, into in levels:
        write_views(storage, level, plan.commit_time, nightly=plan.nightly,
                    release_version=plan.release_version, allow_rewind=plan.allow_rewind,
                    result=into)
    storage.delete([JOURNAL])
    kept: dict[str, list[str]] = {}
    for r in filter(None, (result, result.variants)):
        for why, names in r.nightly_kept.items():
            kept.setdefault(why, []).extend(names)
    for why, names in kept.items():  # one line, however many levels it held back
        log(f"{why} ({', '.join(names)}); nightly only moves forward, --allow-rewind "
            "moves it back")


def recover(storage: Storage, log) -> None:
    data = storage.read(JOURNAL)
    if data is None:
        return
    try:
        plan = Plan.from_json(data)
    except UserError as exc:  # not one a publish wrote: nothing to finish
        log(f"ignoring and removing {exc}")
        storage.delete([JOURNAL])
        return
    log(f"finishing the pages of an interrupted publish of {plan.commit} first")
    write_pages(storage, plan, log, PublishResult(variants=PublishResult()))


@contextmanager
def exclusive(storage: Storage, log):
    """Hold the index lock, and leave the index whole before the caller writes."""
    with storage.lock(log):
        n = storage.clean_temporaries()
        if n:
            log(f"removed {n} temporary file(s) a killed publish left")
        recover(storage, log)
        yield
