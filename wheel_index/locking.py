"""One publish or prune at a time per index. Two publishes of different commits
that interleave read nightly's pointer before either moves it, then both move
it (the older can win), and their page writes mix (index.json of one commit
beside index.html of the other).

A folder: flock on <root>/.lock. The kernel drops it when its holder exits,
however it exits, so a killed publisher never blocks the next one.

S3 has no locks, only conditional writes, and a killed holder cannot let go:
the lock is a lease object. It is created with If-None-Match: * (of racing
creators exactly one succeeds), renewed by its holder every ttl/4 with
If-Match on its own ETag, and taken over with If-Match on the old ETag (of
racing takers exactly one succeeds) once it has gone ttl seconds without a
renewal, measured by S3's own clock (its Date header against the object's
LastModified), so that no publisher's clock decides. A holder whose renewal is
refused has lost the lease: its storage refuses further writes.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path

from tools.errors import UserError

LOCK_NAME = ".lock"
WAIT_S = 600.0  # how long a publish waits for another before giving up
POLL_S = 0.05


@contextmanager
def folder_lock(root: Path, log, wait_s: float = WAIT_S):
    root.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"cannot lock the index {root}: {exc.strerror or exc}") from None
    try:
        deadline, said = time.monotonic() + wait_s, False
        while True:
            try:
                # flock, not lockf: flock locks belong to the open file, so two
                # publishers in threads of one process exclude each other too
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    log(f"waiting for another publish or prune of {root} to finish")
                    said = True
                if time.monotonic() > deadline:
                    raise UserError(f"another publish or prune of {root} has held its lock for "
                                    f"over {wait_s:.0f} s; try again when it is done") from None
                time.sleep(POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


def _status(exc: Exception) -> int | None:
    return getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")


class S3Lease:
    """`with S3Lease(...):` holds the index's lease; `lost` says it was taken over."""

    def __init__(self, client, bucket: str, key: str, where: str, log, ttl_s: float,
                 wait_s: float = WAIT_S):
        self.client, self.bucket, self.key, self.where = client, bucket, key, where
        self.log, self.ttl_s, self.wait_s = log, ttl_s, wait_s
        self.owner = uuid.uuid4().hex
        self.renewals, self.etag, self.lost = 0, None, False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        # the renewal count makes every write's bytes, hence its ETag, new
        return json.dumps({"owner": self.owner, "host": socket.gethostname(),
                           "pid": os.getpid(), "renewal": self.renewals}).encode()

    def _put(self, **condition) -> bool:
        """One conditional write; False when the condition failed."""
        try:
            answer = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(),
                                            ContentType="application/json", **condition)
        except Exception as exc:
            # 412: the condition failed; 409: a concurrent conditional write won; 404: gone
            if _status(exc) in (404, 409, 412):
                return False
            raise UserError(f"S3 locking {self.where} failed: {type(exc).__name__}: {exc}") \
                from None
        self.etag = answer["ETag"]
        return True

    def _holder(self) -> tuple[dict, str, float] | None:
        """(its body, its ETag, seconds since its last write by S3's clock), or None."""
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key)
            body = got["Body"].read()
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise UserError(f"S3 reading the lock of {self.where} failed: "
                            f"{type(exc).__name__}: {exc}") from None
        date = got.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date) if date else datetime.now(timezone.utc)
        try:
            doc = json.loads(body)
            doc = doc if isinstance(doc, dict) else {}
        except ValueError:
            doc = {}  # not ours to read; it still expires like any lease
        return doc, got["ETag"], (now - got["LastModified"]).total_seconds()

    def __enter__(self):
        deadline, said = time.monotonic() + self.wait_s, False
        while not self._put(IfNoneMatch="*"):
            held = self._holder()
            if held is None:
                continue  # released between the two calls
            doc, etag, age = held
            if doc.get("owner") == self.owner:
                self.etag = etag  # a retried create of ours had already succeeded
                break
            if age > self.ttl_s and self._put(IfMatch=etag):
                self.log(f"took over the lock of {self.where} from {doc.get('host')} pid "
                         f"{doc.get('pid')}: not renewed for {age:.0f} s (its publish died)")
                break
            if not said:
                self.log(f"waiting for another publish or prune of {self.where} to finish")
                said = True
            if time.monotonic() > deadline:
                raise UserError(f"another publish or prune of {self.where} has held its lock "
                                f"for over {self.wait_s:.0f} s; try again when it is done")
            time.sleep(POLL_S * 4)
        self._thread = threading.Thread(target=self._renew, daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            self.renewals += 1
            try:
                if not self._put(IfMatch=self.etag):
                    self.lost = True
                    return
            except UserError:
                pass  # S3 unreachable this time: the next renewal may still be in time

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self.lost:
            return
        try:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
            except Exception as err:
                if _status(err) in (404, 412):
                    return  # not ours any more: leave it
                # an S3 without conditional deletes: ours while it still has our ETag
                held = self._holder()
                if held and held[1] == self.etag:
                    self.client.delete_object(Bucket=self.bucket, Key=self.key)
        except Exception as err:
            self.log(f"could not release the lock of {self.where} ({err}); it expires after "
                     f"{self.ttl_s:.0f} s")
