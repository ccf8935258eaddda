"""Where a run reads and writes: paths, the tracking store, the data folders (steps 4, 5 and 7 of
pipeline.schema.validate).

Each check raises `pipeline.config.ConfigError` with one line naming the key, its value and what is allowed. They
create nothing (no folder, no SQLite file) and import no torch, so a bad path is answered as fast as a bad type.
"""

import os
import sqlite3
from pathlib import Path
from typing import Mapping
from urllib.parse import quote

from pipeline.config import ConfigError
from pipeline.data import DATASETS
from pipeline.fields import bad
from pipeline.store import Store


def _is_local(path: str) -> bool:
    return "://" not in str(path)


def _check_folder(key: str, value: str) -> None:
    """A folder a job will create or write into: not a file, not under a file, creatable where missing."""
    path = Path(os.path.expanduser(value))
    if path.is_file():
        raise bad(key, value, "is an existing file; expected a folder (existing or to be created)")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise bad(key, value, f"lies under the file {existing}; expected a folder (existing or to be created)")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        what = "is" if existing == path else f"would be made in {existing}, which is"
        raise bad(key, value, f"{what} not writable")


def check_paths(paths: Mapping[str, str], storage: str, gallery_out: str | None) -> None:
    """paths.root, .data and .runs (`paths`: the section) and trainer.storage exist as folders or can be made;
    gallery.out is a file path whose folder can be made."""
    folders = {**{f"paths.{k}": paths[k] for k in ("root", "data", "runs")}, "trainer.storage": storage}
    for key, value in folders.items():
        if _is_local(value):
            _check_folder(key, value)
    if gallery_out and _is_local(gallery_out):
        if Path(gallery_out).is_dir():
            raise bad("gallery.out", gallery_out, "is a folder; expected a .png file path")
        _check_folder("gallery.out", str(Path(gallery_out).parent))


def tracking_store(store: Store) -> tuple[str, Path | None]:
    """(`key=value` naming where the store comes from, its local SQLite file or None) for the tracking store
    the jobs will use, worked out as pipeline.tracking.tracking_uri does but without creating anything."""
    uri = store.uri
    where = f"tracking.uri={uri}"
    if not uri and os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
        where = f"tracking.uri=null, MLFLOW_TRACKING_URI={uri}"
    if not uri:
        db = store.local_db if _is_local(store.runs) else None
        return f"tracking.uri=null (the store {db})", db
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :].split("?")[0]
        return where, Path(path) if path and path != ":memory:" else None
    return where, None


def check_tracking(store: Store) -> None:
    """The job's local SQLite store, where it exists, is a healthy database (opened read-only; never created here)."""
    where, path = tracking_store(store)
    if path is None:
        return  # a tracking server (http://...), a database server or an in-memory store: not checked here
    if path.is_dir():
        raise ConfigError(f"{where}: the store is a folder; expected a SQLite database file")
    if not path.exists():
        # the default store's folder is paths.runs (checked above, made by the job); a store named in
        # tracking.uri needs its folder
        if not where.startswith("tracking.uri=null (") and not path.parent.is_dir():
            raise ConfigError(f"{where}: the folder {path.parent} does not exist")
        return
    problem = sqlite_problem(path)
    if problem:
        raise ConfigError(
            f"{where}: not a healthy SQLite database ({problem}); move the file aside (a new "
            f"store is made) or set tracking.uri"
        )


def sqlite_problem(path: Path) -> str | None:
    """Why an existing file is no usable SQLite database, or None. Opened read-only: nothing is created. A writer
    killed mid-transaction (a job stopped while it logged) leaves a hot journal, which a read-only connection may not
    roll back; the database is then opened read-write, as the job's own first connection would, and rolled back to
    its last commit (which loses nothing committed) before it is checked."""
    problem = _check_sqlite(path, "ro")
    if problem == _HOT_JOURNAL:
        real = path.resolve()  # the journal lies beside the file a link points to
        if not (os.access(real, os.W_OK) and os.access(real.parent, os.W_OK)):
            return f"{_HOT_JOURNAL}: a killed writer's unfinished transaction, which this user cannot roll back"
        problem = _check_sqlite(path, "rw")
    return problem


_HOT_JOURNAL = "attempt to write a readonly database"


def _hot_journal(e: sqlite3.Error) -> bool:
    """A read-only connection met a hot journal (SQLITE_READONLY_ROLLBACK; Python < 3.11 names no code: its text)."""
    name = getattr(e, "sqlite_errorname", None)
    return name == "SQLITE_READONLY_ROLLBACK" if name else str(e) == _HOT_JOURNAL


def _check_sqlite(path: Path, mode: str) -> str | None:
    """`mode` "ro" or "rw": open the existing file that way (never "rwc": nothing is created) and check it."""
    try:
        con = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode={mode}", uri=True, timeout=5)
    except sqlite3.Error as e:
        return str(e)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        row = con.execute("PRAGMA quick_check(1)").fetchone()
        if row and row[0] != "ok":
            return f"quick_check: {row[0]}"
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            return None  # a job is writing it right now: healthy
        return _HOT_JOURNAL if _hot_journal(e) else str(e)
    except sqlite3.DatabaseError as e:
        return str(e)
    finally:
        con.close()
    return None


def managed_data(data: Mapping, data_root: str) -> bool:
    """A generated dataset (pipeline.data.DATASETS: Spirograph, Photos, a package's) is generated only into the
    managed data folder (train/ and val/ side by side under paths.data, `data_root`); a missing path given by the
    user elsewhere is an error, not a place to write. `data`: the data section."""
    if data["name"] not in DATASETS or not data.get("generate"):
        return False
    if not (_is_local(data["train"]) and _is_local(data["val"]) and _is_local(data_root)):
        return False
    train, val, root = Path(data["train"]), Path(data["val"]), Path(data_root)
    return train.parent == val.parent and root in train.parents and train.name == "train" and val.name == "val"


def check_data(data: Mapping, data_root: str) -> None:
    """The data section's local shard folders exist (the managed ones, generated when missing, can be made)."""
    managed = managed_data(data, data_root)
    for split in ("train", "val"):
        path = data[split]
        if not _is_local(path):
            continue  # remote shards: prepare_data reads their manifests
        p = Path(path)
        if p.is_file():
            raise bad(f"data.{split}", path, "is a file; expected a shard folder (see jobs/make_shards.py)")
        if managed:
            _check_folder(f"data.{split}", path)
        elif not p.is_dir():
            raise bad(
                f"data.{split}",
                path,
                f"shard folder not found; make it with jobs/make_shards.py or point data.{split} at one",
            )
