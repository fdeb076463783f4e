"""Whether nightly may move to a commit: only forward in history.

The rule, in order:
  1. the commit nightly already shows: yes (its pages are rewritten);
  2. --allow-rewind: yes;
  3. git, in the repository publish runs in, knows both commits: no when the
     new commit is an ancestor of nightly's, yes when it descends from it;
  4. otherwise (no repository, a commit git does not have, histories that
     diverged after a force-push): by the commit times recorded in nightly's
     metadata.json and given to publish; no when nightly's is later.

Commit times alone are not history: a rebase or a cherry-pick gives a child an
older committer date than its parent, so ancestry decides wherever git can.
"""
from __future__ import annotations

from pathlib import Path

from tools import gitutil
from wheel_index.documents import parse_metadata_json
from wheel_index.storage import Storage


def stays(storage: Storage, view: str, commit: str, commit_time: int, allow_rewind: bool,
          repo: Path | None = None) -> str | None:
    """Why nightly's view stays where it is, or None when it moves to commit."""
    key = f"{view}/metadata.json"
    current = storage.read(key)
    if current is None or allow_rewind:
        return None
    doc = parse_metadata_json(current, key)
    cur, cur_time = doc["commit"], doc.get("commit_time")
    if cur == commit:
        return None
    repo = repo or Path.cwd()
    if gitutil.is_ancestor(repo, commit, cur):
        return f"nightly stays at {cur}: {commit} is its ancestor"
    if gitutil.is_ancestor(repo, cur, commit):
        return None
    if isinstance(cur_time, int) and cur_time > commit_time:
        return (f"nightly stays at {cur}: committed after {commit}, and git here cannot "
                "relate the two")
    return None
