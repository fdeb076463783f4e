"""Where everything lives in an index, and how long a CDN may cache it.

    <commit>/<variant>/vllm-engine/<wheel>            stored once, immutable
    <commit>/<variant>/vllm-engine/<wheel>.metadata   PEP 658 core metadata
    <commit>/<variant>/vllm-engine/<wheel>.entry.json what the pages say of the wheel
    <commit>/<variant>/vllm-engine/index.html|.json   PEP 503 page / PEP 691 copy
    <commit>/<variant>/index.html|.json, metadata.json
    nightly/<variant>/...  <version>/<variant>/...     views: pages that link to the commit's files
    <commit>/..., nightly/..., <version>/...           the same without <variant> for the
                                                       default (main CUDA) variant
    <commit>/variants/..., nightly/variants/...      the PEP 825 variant wheels of every
                                                       variant (wheel_index/variants_level.py)
"""
from __future__ import annotations

import posixpath
import re
from urllib.parse import quote

from tools.requirements import REPO_ROOT

PROJECT = "vllm-engine"
NIGHTLY = "nightly"
#: The level of a commit's PEP 825 variant wheels, beside its per-variant levels
#: (a folder name, not a variant: tools.variants.VARIANTS holds those).
VARIANTS_LEVEL = "variants"
#: The folder index ci/ publishes into and precompiled mode reads by default:
#: the whole loop works on one machine.
DEFAULT_WHEEL_INDEX = REPO_ROOT / "index"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
ENTRY_SUFFIX = ".entry.json"
METADATA_SUFFIX = ".metadata"
PAGE_NAMES = ("index.html", "index.json")

IMMUTABLE = "public, max-age=31536000, immutable"
NIGHTLY_PAGE = "public, max-age=60, must-revalidate"
PAGE = "public, max-age=300"

JSON_CT = "application/json"
SIMPLE_JSON_CT = "application/vnd.pypi.simple.v1+json"
HTML_CT = "text/html; charset=utf-8"


def level_dir(commit: str, level: str) -> str:
    """The folder a commit's wheels of one level are stored in: a variant's,
    or the variant wheels of VARIANTS_LEVEL."""
    return f"{commit}/{level}"


def project_dir(view_dir: str) -> str:
    return f"{view_dir}/{PROJECT}" if view_dir else PROJECT


def url_path(rel: str) -> str:
    """Percent-encode each segment of a relative path (RFC 3986). S3's REST and
    website endpoints and CDNs in front of them read a literal '+' in a path as
    a space, and every wheel's local version has one: it must go as %2B."""
    return "/".join(quote(seg, safe="") for seg in rel.split("/"))


def href(file_key: str, view_dir: str) -> str:
    """A link from a view's project page to a stored file, relative so that the
    index can be moved or served under any prefix, and percent-encoded."""
    return url_path(posixpath.relpath(file_key, project_dir(view_dir)))


def cache_control(key: str) -> str:
    if key.endswith((".whl", METADATA_SUFFIX, ENTRY_SUFFIX)):
        return IMMUTABLE
    if key == NIGHTLY or key.startswith(NIGHTLY + "/"):
        return NIGHTLY_PAGE
    return PAGE


def content_type(key: str) -> str:
    if key.endswith(".html") or key.endswith("/") or key == "":
        return HTML_CT
    if key.endswith(".json"):
        return JSON_CT
    if key.endswith(METADATA_SUFFIX):
        return "text/plain; charset=utf-8"
    return "application/octet-stream"
