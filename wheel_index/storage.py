"""One small storage interface, two implementations: a local folder and the
S3 API (boto3). The index logic never knows which it has.

Writes are atomic: on disk a temporary name then a rename, on S3 one PUT.
Names starting with "." are the index's own (its lock, the journal of a publish
in progress, temporaries): no listing shows them, so no page, verify, ls or
prune ever sees them. No published name starts with ".".
"""
from __future__ import annotations

import builtins
import os
import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from tools.atomic import write_atomic
from tools.errors import UserError
from wheel_index import locking
from wheel_index.layout import COMMIT_RE, NIGHTLY, cache_control, content_type

TMP_PREFIX = ".tmp-"


def hidden(key: str) -> bool:
    return key.rsplit("/", 1)[-1].startswith(".")


class Storage(ABC):
    #: object stores serve no directory index: a page is also stored under its
    #: folder's own key ("<dir>/"), which is what clients ask for.
    dir_keys: bool = False

    @abstractmethod
    def read(self, key: str) -> bytes | None: ...

    @abstractmethod
    def write_atomic(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def upload_file(self, key: str, path: Path) -> None: ...

    # In this class body `list` is the method below, so annotations say builtins.list.
    @abstractmethod
    def list(self, prefix: str) -> builtins.list[str]:
        """Every key under prefix/ (recursively), sorted."""

    @abstractmethod
    def stats(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        """Every key under prefix ("" for all): its size and ETag (None on a
        folder), from one listing."""

    def sizes(self, prefix: str) -> dict[str, int]:
        return {k: size for k, (size, _) in self.stats(prefix).items()}

    @abstractmethod
    def etag(self, key: str) -> str | None:
        """The stored object's ETag; None on a folder."""

    @abstractmethod
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The names of the immediate sub-folders of prefix."""

    @abstractmethod
    def delete(self, keys: builtins.list[str]) -> None: ...

    @abstractmethod
    def describe(self) -> str:
        """Where this is, for messages (never credentials)."""

    @abstractmethod
    def lock(self, log):
        """A context manager holding the index's lock (wheel_index/locking.py)."""

    @abstractmethod
    def clean_temporaries(self) -> int:
        """Remove what killed writers left (only safe under lock()); how many."""


class LocalStorage(Storage):
    def __init__(self, root: Path):
        self.root = Path(root).absolute()

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve() if key else self.root
        if p != self.root.resolve() and self.root.resolve() not in p.parents:
            raise UserError(f"key {key!r} leaves the index folder {self.root}")
        return p

    def read(self, key):
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _atomic(self, key: str, write) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dest, write, prefix=TMP_PREFIX)

    def write_atomic(self, key, data):
        self._atomic(key, lambda f: f.write(data))

    def upload_file(self, key, path):
        def copy(f):
            with open(path, "rb") as src:
                while chunk := src.read(1 << 20):
                    f.write(chunk)

        self._atomic(key, copy)

    def list(self, prefix):
        return sorted(self.sizes(prefix))

    def stats(self, prefix):
        base = self._path(prefix)
        if not base.is_dir():
            return {}
        out = {}
        for dirpath, _, files in os.walk(base):
            for name in files:
                if not hidden(name):
                    p = Path(dirpath, name)
                    out[p.relative_to(self.root).as_posix()] = (p.stat().st_size, None)
        return out

    def etag(self, key):
        return None

    def list_dirs(self, prefix=""):
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and not hidden(p.name))

    def delete(self, keys):
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        # remove folders left empty
        for key in sorted({str(Path(k).parent) for k in keys}, key=len, reverse=True):
            d = self._path(key)
            while d != self.root and d.is_dir() and not any(d.iterdir()):
                d.rmdir()
                d = d.parent

    def describe(self):
        return str(self.root)

    def lock(self, log):
        return locking.folder_lock(self.root, log)

    def clean_temporaries(self):
        if not self.root.is_dir():
            return 0
        stale = [Path(d, n) for d, _, files in os.walk(self.root) for n in files
                 if n.startswith(TMP_PREFIX)]
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)


class S3Storage(Storage):
    """Bucket and prefix from s3://bucket/prefix; endpoint, region and
    credentials come from the usual AWS variables (AWS_ENDPOINT_URL,
    AWS_REGION, AWS_ACCESS_KEY_ID, ...) through boto3, and are never printed."""

    dir_keys = True
    #: seconds the lock lease lives without a renewal (wheel_index/locking.py)
    lock_ttl_s = 120.0

    def __init__(self, bucket: str, prefix: str, client=None):
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._held = threading.local()  # the lease this thread's publish holds
        self.client = client or boto3.client(
            "s3", config=Config(retries={"max_attempts": 5, "mode": "standard"}))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _errors(self, what: str, exc: Exception):
        return UserError(f"S3 {what} failed for s3://{self.bucket}/{self.prefix}: "
                         f"{type(exc).__name__}: {exc}")

    def read(self, key):
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._errors(f"reading {key}", exc) from None

    def _put_args(self, key):
        return dict(Bucket=self.bucket, Key=self._key(key), ContentType=content_type(key),
                    CacheControl=cache_control(key))

    def _check_lease(self) -> None:
        lease = getattr(self._held, "lease", None)
        if lease is not None and lease.lost:
            raise UserError(f"{self.describe()}: another publisher took over this one's lock "
                            f"(it went {self.lock_ttl_s:.0f} s without a renewal); nothing more "
                            "is written, run the publish again")

    def write_atomic(self, key, data):
        self._check_lease()
        try:
            self.client.put_object(Body=data, **self._put_args(key))
        except Exception as exc:
            raise self._errors(f"writing {key}", exc) from None

    def upload_file(self, key, path):
        self._check_lease()
        args = self._put_args(key)
        try:
            self.client.upload_file(str(path), args.pop("Bucket"), args.pop("Key"),
                                    ExtraArgs=args)
        except Exception as exc:
            raise self._errors(f"uploading {key}", exc) from None

    def _paginate(self, **kw):
        try:
            yield from self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, **kw)
        except Exception as exc:
            raise self._errors("listing", exc) from None

    def list(self, prefix):
        return sorted(self.sizes(prefix))

    def stats(self, prefix):
        full = self._key(prefix).rstrip("/") + "/" if (prefix or self.prefix) else ""
        strip = len(self._key("")) if self.prefix else 0
        return {o["Key"][strip:]: (o["Size"], o.get("ETag"))
                for page in self._paginate(Prefix=full)
                for o in page.get("Contents", [])
                if not o["Key"].endswith("/") and not hidden(o["Key"])}

    def etag(self, key):
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key)).get("ETag")
        except Exception as exc:
            raise self._errors(f"reading the ETag of {key}", exc) from None

    def list_dirs(self, prefix=""):
        full = self._key(prefix).rstrip("/") + "/" if (prefix or self.prefix) else ""
        names = set()
        for page in self._paginate(Prefix=full, Delimiter="/"):
            for p in page.get("CommonPrefixes", []):
                names.add(p["Prefix"][len(full):].strip("/"))
        return sorted(n for n in names if n and not hidden(n))

    def delete(self, keys):
        self._check_lease()
        full = [self._key(k) for k in keys]
        for i in range(0, len(full), 1000):
            batch = [{"Key": k} for k in full[i:i + 1000]]
            try:
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})
            except Exception as exc:
                raise self._errors("deleting", exc) from None
            # delete_objects succeeds as a call while failing per key: read its Errors.
            failed = answer.get("Errors") or []
            if failed:
                shown = "; ".join(f"{e.get('Key')} ({e.get('Code')}: {e.get('Message')})"
                                  for e in failed[:5])
                more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
                raise UserError(f"S3 could not delete {len(failed)} key(s) in "
                                f"s3://{self.bucket}: {shown}{more}")

    def describe(self):
        return f"s3://{self.bucket}/{self.prefix}"

    @contextmanager
    def lock(self, log):
        lease = locking.S3Lease(self.client, self.bucket, self._key(locking.LOCK_NAME),
                                self.describe(), log, self.lock_ttl_s)
        with lease:
            self._held.lease = lease
            try:
                yield
            finally:
                self._held.lease = None

    def clean_temporaries(self):
        """Abort the multipart uploads a killed publisher left (unseen, but billed)."""
        prefix = self._key("").rstrip("/") + "/" if self.prefix else ""
        aborted = 0
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for u in page.get("Uploads", []):
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"],
                                                       UploadId=u["UploadId"])
                    aborted += 1
        except Exception:
            pass  # best effort: a policy may deny it, and the index is whole without it
        return aborted


def open_index(spec: str, *, create: bool = False) -> Storage:
    """The storage of an existing index, or one that may be created (publish).

    Refused with one line: a folder that does not exist (unless create), a file,
    an empty folder or prefix (unless create), anything holding files but
    neither a <commit>/ nor a nightly/ folder."""
    storage = open_storage(spec)
    if isinstance(storage, LocalStorage):
        root = storage.root
        if root.exists() and not root.is_dir():
            raise UserError(f"--index {spec}: is a file, not an index folder")
        if not root.exists():
            if create:
                return storage
            raise UserError(f"--index {spec}: no such folder; give the folder `publish` wrote "
                            "(for example ./index)")
    tops = storage.list_dirs("")
    if any(COMMIT_RE.fullmatch(t) or t == NIGHTLY for t in tops):
        return storage
    if not tops and not storage.sizes(""):
        if create:
            return storage
        raise UserError(f"--index {spec}: is empty, nothing is published there yet")
    raise UserError(f"--index {spec}: is not a wheel index (it has no <commit>/ or {NIGHTLY}/ "
                    "folder); check the path")


def open_storage(spec: str) -> Storage:
    """A folder, file://folder or s3://bucket/prefix."""
    if spec.startswith("s3://"):
        u = urlparse(spec)
        if not u.netloc:
            raise UserError(f"--index {spec!r}: an S3 index is s3://<bucket>[/<prefix>]")
        return S3Storage(u.netloc, u.path)
    if spec.startswith("file://"):
        spec = urlparse(spec).path
    elif "://" in spec:
        raise UserError(f"--index {spec!r}: use a folder, file://<folder> or s3://<bucket>/<prefix>")
    return LocalStorage(Path(spec))
