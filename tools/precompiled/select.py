"""Which precompiled wheel to use, failing closed.

1. VLLM_PRECOMPILED_WHEEL_LOCATION (URL or path) wins and skips every look-up.
2. The commit: VLLM_PRECOMPILED_WHEEL_COMMIT (40-hex or `nightly`), else the
   merge-base of HEAD with main (origin/main when it exists, else main;
   VLLM_PRECOMPILED_BASE_REF overrides).
3. The variant: VLLM_PRECOMPILED_WHEEL_VARIANT, else what tools.target detects.
4. The index: VLLM_PRECOMPILED_WHEEL_INDEX (folder, file://, http(s)://), else
   the project's default folder index (DEFAULT_WHEEL_INDEX).
5. <index>/<commit>/<variant>/metadata.json names the wheel and its sha256.
   An index that is a variants level (<index>/<commit>/variants, nightly/variants,
   <version>/variants) names its commit itself; its metadata.json lists every
   variant, and the detected one is taken from it.

When the base commit has no wheel yet, main's first-parent history is walked
back (at most FALLBACK_DEPTH commits) to the newest commit with a wheel of this
variant whose compiled inputs are byte-identical to the base commit's.
"""
from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from packaging.tags import sys_tags

from tools import build_settings, gitutil
from tools.errors import UserError
from tools.precompiled.fetch import get_bytes, local_path
from tools.target import detect
from tools.variants import get_variant
from wheel_index.documents import check_sha256, parse_metadata_json
from wheel_index.layout import COMMIT_RE, DEFAULT_WHEEL_INDEX, VARIANTS_LEVEL

FALLBACK_DEPTH = 20


@dataclass(frozen=True)
class Choice:
    url: str
    sha256: str | None
    variant: str
    commit: str | None
    filename: str
    fallback_from: str | None = None


def index_url(env: Mapping[str, str]) -> str:
    """VLLM_PRECOMPILED_WHEEL_INDEX, else the project's folder index; a folder
    that does not exist, or a scheme nothing here reads, is refused by name."""
    given = build_settings.precompiled_wheel_index(env)
    index = (given or str(DEFAULT_WHEEL_INDEX)).rstrip("/")
    if "://" in index and not index.startswith(("http://", "https://", "file://")):
        raise UserError(f"VLLM_PRECOMPILED_WHEEL_INDEX={index}: use a folder, file://<folder> "
                        "or http(s)://<index URL> (an S3 bucket through its HTTPS endpoint)")
    folder = local_path(index)
    if folder is not None and not folder.is_dir():
        if given:
            raise UserError(f"VLLM_PRECOMPILED_WHEEL_INDEX={given}: no such folder")
        raise UserError(f"no wheel index: VLLM_PRECOMPILED_WHEEL_INDEX is unset and the "
                        f"project's folder index {DEFAULT_WHEEL_INDEX} does not exist; set "
                        "VLLM_PRECOMPILED_WHEEL_INDEX=<folder or URL>, or "
                        "VLLM_PRECOMPILED_WHEEL_LOCATION=<wheel URL or path>, or publish with "
                        "ci/nightly-local.sh")
    return index


def join_url(base: str, rel: str) -> str:
    """A percent-encoded relative link of the index resolved against base: a
    plain path for a folder index (decoded), a URL otherwise (kept encoded)."""
    if local_path(base) is not None and not base.startswith("file://"):
        return posixpath.normpath(posixpath.join(base, unquote(rel)))
    scheme, rest = base.split("://", 1)
    return f"{scheme}://{posixpath.normpath(posixpath.join(rest, rel))}"


def _variant(env: Mapping[str, str], log) -> str:
    label = build_settings.precompiled_variant(env)
    if label:
        return get_variant(label).label
    target = detect(env)
    log(f"vllm-engine: precompiled variant {target.variant.label} (detected: "
        f"{'; '.join(target.reasons[-2:])}); set VLLM_PRECOMPILED_WHEEL_VARIANT to choose")
    return target.variant.label


def read_level_metadata(index: str, level: str) -> dict | None:
    """<index>/<level>/metadata.json, checked; None when the level is not there."""
    data = get_bytes(f"{index}/{level}/metadata.json")
    if data is None:
        return None
    return parse_metadata_json(data, f"{index}/{level}/metadata.json")


def parse_location(location: str) -> tuple[str, str | None]:
    """VLLM_PRECOMPILED_WHEEL_LOCATION: (URL or path, sha256 from a #sha256= fragment)."""
    url, sep, frag = location.partition("#")
    if not sep:
        return url, None
    if not frag.startswith("sha256="):
        raise UserError(f"VLLM_PRECOMPILED_WHEEL_LOCATION={location}: the only fragment "
                        "understood is #sha256=<64 hex digits>")
    return url, check_sha256(frag[len("sha256="):].lower(), "VLLM_PRECOMPILED_WHEEL_LOCATION")


def variants_level_metadata(index: str) -> dict | None:
    """The metadata.json of the variants level `index` names, else None."""
    if posixpath.basename(index.rstrip("/")) != VARIANTS_LEVEL:
        return None
    meta = read_level_metadata(index.rstrip("/").rsplit("/", 1)[0], VARIANTS_LEVEL)
    return meta if meta is not None and meta.get("level") == VARIANTS_LEVEL else None


def pick_wheel(meta: dict, variant: str, index: str, level: str,
               root: str | None = None) -> tuple[dict, str] | None:
    """The wheel of this variant that installs on this machine, and its URL, which
    must stay inside `root` (the index; default `index`)."""
    supported = [str(t) for t in sys_tags()]
    best = None
    for w in meta.get("wheels", []):
        if w.get("variant") != variant:
            continue
        tags = [f"{py}-{abi}-{plat}" for py in w["python_tag"].split(".")
                for abi in w["abi_tag"].split(".") for plat in w["platform_tag"].split(".")]
        ranks = [supported.index(t) for t in tags if t in supported]
        if ranks and (best is None or min(ranks) < best[0]):
            best = (min(ranks), w)
    if best is None:
        return None
    url = join_url(f"{index}/{level}", best[1]["path"])
    if not url.startswith(f"{(root or index).rstrip('/')}/"):
        raise UserError(f"{index}/{level}/metadata.json: path {best[1]['path']!r} leads out of "
                        "the index; refusing it")
    return best[1], url


def _base_commit(root: Path, env: Mapping[str, str]) -> str:
    if not gitutil.is_repo(root):
        raise UserError("this source tree has no git metadata (an sdist or a tarball), so the "
                        "commit to take kernels from is unknown: set "
                        "VLLM_PRECOMPILED_WHEEL_COMMIT=<40-hex sha>|nightly or "
                        "VLLM_PRECOMPILED_WHEEL_LOCATION=<wheel URL or path>")
    ref = build_settings.precompiled_base_ref(env)
    if not ref:
        ref = "origin/main" if gitutil.rev(root, "origin/main") else "main"
    if gitutil.rev(root, ref) is None:
        raise UserError(f"the main branch {ref!r} is not in this repository; fetch it "
                        f"(git fetch origin main) or set VLLM_PRECOMPILED_BASE_REF")
    base = gitutil.merge_base(root, "HEAD", ref)
    if base is None:
        if gitutil.is_shallow(root):
            raise UserError(f"this is a shallow clone and HEAD's merge-base with {ref} is not in "
                            f"it; run: git fetch --unshallow origin  (or git fetch --deepen=200 "
                            "origin main), or set VLLM_PRECOMPILED_WHEEL_COMMIT")
        raise UserError(f"HEAD has no common ancestor with {ref}; set "
                        "VLLM_PRECOMPILED_WHEEL_COMMIT or VLLM_PRECOMPILED_BASE_REF")
    return base


def _ways_out(commit: str, variant: str, index: str) -> str:
    return (f"no precompiled {variant} wheel for {commit} in the index {index} (looked for "
            f"{index}/{commit}/{variant}/metadata.json; its CI may still be running). "
            "The index comes from VLLM_PRECOMPILED_WHEEL_INDEX (else ./index), the commit from "
            "VLLM_PRECOMPILED_WHEEL_COMMIT (else HEAD's merge-base with main, "
            "VLLM_PRECOMPILED_BASE_REF), the variant from VLLM_PRECOMPILED_WHEEL_VARIANT (else "
            "detected). Ways out: wait and retry; VLLM_PRECOMPILED_WHEEL_COMMIT=nightly; "
            "VLLM_PRECOMPILED_WHEEL_LOCATION=<wheel URL or path>; or build from source "
            "(unset VLLM_USE_PRECOMPILED)")


def choose_wheel(root: Path, env: Mapping[str, str], log=print) -> Choice:
    variant = _variant(env, log)
    location = build_settings.precompiled_location(env)
    if location:
        url, sha256 = parse_location(location)
        return Choice(url, sha256, variant, None, unquote(Path(url).name))

    index = index_url(env)
    asked = build_settings.precompiled_commit(env)
    in_git = gitutil.is_repo(root)
    level_meta = variants_level_metadata(index)
    if level_meta is not None:  # the URL chose the commit; the machine chooses the variant
        commit: str = level_meta["commit"]  # parse_metadata_json checked it: 40 hex digits
        if asked and asked != commit and not (asked == "nightly" and level_meta.get(
                "view", "").startswith("nightly/")):
            raise UserError(f"VLLM_PRECOMPILED_WHEEL_INDEX={index} is the variants level of "
                            f"{commit}, but VLLM_PRECOMPILED_WHEEL_COMMIT={asked}; unset one")
        if in_git and gitutil.rev(root, commit) and gitutil.compiled_inputs_differ(
                root, commit, None):
            log(f"vllm-engine: WARNING: {index} holds kernels of {commit}, built from compiled "
                "inputs that differ from this checkout; using them because the index was "
                "chosen explicitly")
        # a variants level lies two folders below the index root (<commit>/variants,
        # nightly/variants, <version>/variants); its links lead to <commit>/variants
        index_root = index.rstrip("/").rsplit("/", 2)[0]
        return _finish(level_meta, variant, index, "", commit, None, index_root)
    if asked == "nightly":
        meta = read_level_metadata(index, f"nightly/{variant}")
        if meta is None:
            raise UserError(f"the index {index} has no nightly {variant} wheel (no nightly/"
                            f"{variant}/metadata.json); publish one, choose a commit with "
                            "VLLM_PRECOMPILED_WHEEL_COMMIT, another index with "
                            "VLLM_PRECOMPILED_WHEEL_INDEX or another variant with "
                            "VLLM_PRECOMPILED_WHEEL_VARIANT")
        commit = meta["commit"]
        if in_git:
            changed = gitutil.compiled_inputs_differ(root, commit, None) if gitutil.rev(
                root, commit) else ["(nightly's commit is not in this repository)"]
            if changed:
                log(f"vllm-engine: WARNING: nightly ({commit}) was built from compiled inputs "
                    f"that differ from this checkout: {', '.join(changed[:10])}; using it "
                    "because VLLM_PRECOMPILED_WHEEL_COMMIT=nightly was set explicitly")
        return _finish(meta, variant, index, f"nightly/{variant}", commit, None)

    if asked:
        if not COMMIT_RE.fullmatch(asked):
            raise UserError(f"VLLM_PRECOMPILED_WHEEL_COMMIT={asked!r} is neither a full 40-hex "
                            "commit nor 'nightly'")
        base = asked
    else:
        base = _base_commit(root, env)
    if in_git and gitutil.rev(root, base):
        changed = gitutil.compiled_inputs_differ(root, base, None)
        if changed:
            msg = (f"this checkout changes compiled inputs since {base[:12]}: "
                   f"{', '.join(changed[:20])}; the precompiled kernels would not contain "
                   "them. Build from source, or set VLLM_PRECOMPILED_ALLOW_CSRC_CHANGES=1")
            if build_settings.allow_csrc_changes(env):
                log(f"vllm-engine: WARNING: {msg}")
            else:
                raise UserError(msg)

    meta = read_level_metadata(index, f"{base}/{variant}")
    if meta is not None:
        return _finish(meta, variant, index, f"{base}/{variant}", base, None)
    if asked or not in_git:
        raise UserError(_ways_out(base, variant, index))
    # The base commit's wheel is not built yet: an older main commit whose
    # kernels are made from identical inputs is just as good.
    for older in gitutil.first_parents(root, base, FALLBACK_DEPTH + 1)[1:]:
        meta = read_level_metadata(index, f"{older}/{variant}")
        if meta is None:
            continue
        if gitutil.compiled_inputs_differ(root, older, base):
            raise UserError(
                f"{_ways_out(base, variant, index)}. The newest older main commit with a wheel, "
                f"{older[:12]}, has different compiled inputs, so its kernels are not safe to use")
        log(f"vllm-engine: no {variant} wheel for {base[:12]} yet; using {older[:12]} "
            f"({gitutil.subject(root, older)!r}), whose compiled inputs are identical")
        return _finish(meta, variant, index, f"{older}/{variant}", older, base)
    raise UserError(f"{_ways_out(base, variant, index)} (looked back {FALLBACK_DEPTH} commits)")


def _finish(meta: dict, variant: str, index: str, level: str, commit: str | None,
            fallback_from: str | None, root: str | None = None) -> Choice:
    picked = pick_wheel(meta, variant, index, level, root)
    if picked is None:
        raise UserError(f"{index}/{level} has no {variant} wheel for this platform "
                        f"({next(iter(sys_tags()))}); a wheel of another variant or platform is "
                        "never used")
    w, url = picked
    return Choice(url, w["sha256"], variant, commit, w["filename"], fallback_from)
