"""Publishes of different commits at once take turns (a lock per index), so
nightly ends on the newer commit and its pages agree: threads on a folder and on
S3 (moto's server), 20 racing `python -m wheel_index publish --nightly` pairs,
and the S3 lease's renewal, takeover and loss."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import REPO, make_wheel, nightly
from tools.errors import UserError
from wheel_index import maintain
from wheel_index.publish import publish
from wheel_index.storage import LocalStorage, open_storage

A = "a" * 40


def commit(n: int) -> str:
    return format(0xC0FFEE0000 + n, "040x")


def wheels(tmp_path, c):
    return [make_wheel(tmp_path / "w" / c[-6:] / p, "0.1.dev3+g1234567.cpu", commit=c, platform=p)
            for p in ("manylinux_2_34_x86_64", "manylinux_2_34_aarch64")]


def test_racing_nightly_publishes_in_threads(store, tmp_path):
    for i in range(4 if isinstance(store, LocalStorage) else 2):  # moto's server is slow
        old, new = commit(2 * i), commit(2 * i + 1)
        jobs = [(old, wheels(tmp_path, old), 10 * i + 1), (new, wheels(tmp_path, new), 10 * i + 2)]
        start = threading.Barrier(2)

        def one(job):
            c, ws, when = job
            start.wait()
            publish(store, c, ws, nightly=True, commit_time=str(when), log=lambda m: None)

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(one, jobs))
        assert nightly(store) == new, f"pair {i}"
        assert maintain.verify(store, log=lambda m: None) == [], f"pair {i}"


def _publish_cmd(idx, c, when, ws):
    return [sys.executable, "-m", "wheel_index", "publish", "--index", str(idx), "--commit", c,
            "--commit-time", str(when), "--nightly", *map(str, ws)]


@pytest.mark.slow
def test_twenty_racing_cli_publish_pairs_end_on_the_newer_commit(tmp_path):
    """Measured before the lock: 6 of 20 pairs left nightly on the older commit
    (both exit 0, verify clean), 1 of 20 index.json and index.html disagreeing."""
    idx = tmp_path / "index"
    for i in range(20):
        old, new = commit(2 * i), commit(2 * i + 1)
        cmds = [_publish_cmd(idx, old, 10 * i + 1, wheels(tmp_path, old)),
                _publish_cmd(idx, new, 10 * i + 2, wheels(tmp_path, new))]
        if i % 2:
            cmds.reverse()  # neither is always the first to start
        procs = [subprocess.Popen(c, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for c in cmds]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, out + err
        storage = open_storage(str(idx))
        assert nightly(storage) == new, f"pair {i}"
        problems = maintain.verify(storage, log=lambda m: None)
        assert problems == [], f"pair {i}: {problems}"
    assert not list(idx.rglob(".tmp-*"))


# ---- the S3 lease --------------------------------------------------------------------


def test_s3_lock_of_a_killed_publisher_is_taken_over(s3_env, tmp_path):
    store = open_storage(f"s3://{s3_env}/wheels")
    store.lock_ttl_s = 2
    store.client.put_object(Bucket=s3_env, Key="wheels/.lock",
                            Body=b'{"owner": "gone", "host": "ci-7", "pid": 42, "renewal": 0}')
    said = []
    publish(store, A, wheels(tmp_path, A), nightly=True, commit_time="1", log=said.append)
    assert any("waiting for another publish" in m for m in said)
    assert any("took over the lock" in m and "ci-7 pid 42" in m for m in said), said
    assert maintain.verify(store, log=lambda m: None) == []
    assert store.read(".lock") is None  # released, and never listed
    assert ".lock" not in store.list("")


def test_s3_lock_renewed_by_a_live_holder_is_waited_for(s3_env, tmp_path):
    store = open_storage(f"s3://{s3_env}/wheels")
    store.lock_ttl_s = 1  # renewed every 0.25 s: held for 3 s, it never expires
    held, released = threading.Event(), []

    def holder():
        with store.lock(lambda m: None):
            held.set()
            time.sleep(3)
            released.append(time.monotonic())

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    said = []
    publish(store, A, wheels(tmp_path, A), nightly=True, commit_time="1", log=said.append)
    done = time.monotonic()
    t.join()
    assert released and done >= released[0]
    assert not any("took over" in m for m in said)


def test_s3_holder_whose_lease_was_taken_writes_nothing_more(s3_env):
    store = open_storage(f"s3://{s3_env}/wheels")
    store.lock_ttl_s = 0.4
    with store.lock(lambda m: None):
        store.write_atomic("x/one.txt", b"1")
        # another publisher, believing this one dead, took the lease over
        store.client.put_object(Bucket=s3_env, Key="wheels/.lock", Body=b'{"owner": "other"}')
        time.sleep(0.4)  # past a renewal, which is refused
        with pytest.raises(UserError, match="took over this one's lock"):
            store.write_atomic("x/two.txt", b"2")
    assert store.read("x/two.txt") is None
    assert store.read(".lock") == b'{"owner": "other"}'  # not released: not ours
