"""Download a wheel once, check its sha256 before it is used, keep it in a
cache keyed by that hash, so a reinstall does no network at all."""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from tools.build_settings import precompiled_cache
from tools.errors import UserError
from tools.hashing import sha256_file

TIMEOUT = (10, 120)  # connect, read (seconds)


def cache_dir(env: Mapping[str, str]) -> Path:
    if precompiled_cache(env):
        return Path(precompiled_cache(env))
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-engine" / "precompiled"


def _check(path: Path, want: str | None, source: str) -> None:
    if want and sha256_file(path) != want:
        raise UserError(f"{source}: sha256 mismatch (expected {want}); the file is corrupt or "
                        "was replaced. Nothing was installed.")


def local_path(url: str) -> Path | None:
    if url.startswith("file://"):
        return Path(unquote(urlparse(url).path))
    if "://" not in url:
        return Path(url)
    return None


def _session():
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    s = requests.Session()
    retry = Retry(total=4, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504),
                  allowed_methods=("GET", "HEAD"))
    s.mount("http://", HTTPAdapter(max_retries=retry))
    s.mount("https://", HTTPAdapter(max_retries=retry))
    return s


def get_bytes(url: str) -> bytes | None:
    """A small document (metadata.json); None when it does not exist."""
    path = local_path(url)
    if path is not None:
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc}") from None
    import requests

    try:
        r = _session().get(url, timeout=TIMEOUT)
    except requests.RequestException as exc:
        raise UserError(f"cannot reach the wheel index at {url}: {type(exc).__name__}: {exc}. "
                        "Check VLLM_PRECOMPILED_WHEEL_INDEX or the network.") from None
    if r.status_code in (403, 404):
        return None
    if r.status_code != 200:
        raise UserError(f"{url} answered HTTP {r.status_code}")
    return r.content


def fetch(url: str, sha256: str | None, env: Mapping[str, str], log=print) -> Path:
    """The wheel at url as a local file whose hash has been checked."""
    path = local_path(url)
    if path is not None:  # used in place, not copied
        if not path.is_file():
            raise UserError(f"precompiled wheel {path} does not exist")
        _check(path, sha256, str(path))
        return path
    name = unquote(Path(urlparse(url).path).name)
    if not name.endswith(".whl") or "/" in name or name.startswith("."):
        raise UserError(f"{url} does not name a wheel file (…/<name>.whl)")
    if sha256:
        cached = cache_dir(env) / sha256 / name
        if cached.is_file() and sha256_file(cached) == sha256:
            log(f"vllm-engine: {name} from the cache ({cached.parent})")
            return cached
    import requests

    dest_dir = cache_dir(env) / (sha256 or "unverified")
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot use the download cache {cache_dir(env)} ({exc.strerror or exc}); "
                        "set VLLM_PRECOMPILED_CACHE to a writable folder") from None
    fd, tmp = tempfile.mkstemp(prefix=".download-", dir=dest_dir)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f, _session().get(url, stream=True, timeout=TIMEOUT) as r:
            if r.status_code != 200:
                raise UserError(f"downloading {url} failed: HTTP {r.status_code}")
            total = int(r.headers.get("Content-Length") or 0)
            for chunk in _progress(r.iter_content(1 << 20), total, name):
                f.write(chunk)
                h.update(chunk)
        if sha256 and h.hexdigest() != sha256:
            raise UserError(f"{url}: sha256 mismatch (expected {sha256}, got {h.hexdigest()}); "
                            "the download is corrupt or the index is wrong. Nothing was installed.")
        final = dest_dir / name
        os.replace(tmp, final)
        return final
    except requests.RequestException as exc:
        raise UserError(f"downloading {url} failed: {type(exc).__name__}: {exc}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _progress(chunks, total: int, name: str):
    """Progress for downloads over a few MB: a rich bar on a terminal (when rich
    is installed), otherwise a line per tenth on stderr, which pip and uv show
    with -v (a build backend's output is captured)."""
    if total < (4 << 20):
        yield from chunks
        return
    try:
        if not sys.stderr.isatty():
            raise ImportError
        from rich.progress import Progress
    except ImportError:
        done, next_mark = 0, 0.1
        for chunk in chunks:
            done += len(chunk)
            if done / total >= next_mark:
                print(f"vllm-engine: downloading {name}: {done * 100 // total}% of "
                      f"{total >> 20} MiB", file=sys.stderr)
                next_mark += 0.1
            yield chunk
        return
    with Progress(transient=True) as progress:
        task = progress.add_task(f"downloading {name}", total=total)
        for chunk in chunks:
            progress.update(task, advance=len(chunk))
            yield chunk
