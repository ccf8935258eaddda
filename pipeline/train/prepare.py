"""Before Ray starts: validate the whole config, make the embedded data when it is the chosen data and missing,
check every shard, name the run, and make its plan (pipeline.plan: lr, local batch, steps per epoch)."""

from __future__ import annotations

import copy
import fcntl
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline import preflight
from pipeline.config import ConfigError, config_hash
from pipeline.data import DATASETS
from pipeline.locations import managed_data
from pipeline.plan import RunPlan, make_plan
from pipeline.schema import check_method, validate
from pipeline.store import Store


def _log(msg: str) -> None:
    print(f"[pretrain] {msg}", flush=True)


def resolve(cfg: dict) -> RunPlan:
    """Check everything that can be checked before Ray starts, complete the config (the run's name, MoCo's BN
    groups: what a checkpoint's config rebuilds the model from) and return the run's plan.

    Raises ConfigError with one line: pipeline.schema.validate's checks come first, then the tracking server's
    login; the method's own checks (which import torch) come before any data is made,
    or, where the data exists, after its shards are checked (prepare_data), so that cheap errors are answered
    fast and nothing is made before everything has been checked."""
    c = validate(cfg, method=False)  # the method's own checks import torch: below
    server = Store.of(cfg).server()
    if server:  # before the data is made or checked: a refused login is answered at once
        preflight.check_server(server, c.typed.tracking.experiment)
    data, data_root = cfg["data"], c.typed.paths.data
    making = _must_make(data, data_root)
    if making:  # nothing is made before every check has passed
        check_method(c)
    n = int(prepare_data(data, data_root)["num_samples"])
    if not making:  # after the shards' check, so that a bad shard is answered before torch is imported
        check_method(c)
    from pipeline.build import complete_method  # torch, already loaded by check_method's import of the method

    cfg["method"].update(complete_method(c))  # e.g. MoCo's BN groups, which check_method checked against the batch
    t, workers = c.typed.train, c.typed.trainer.num_workers
    plan = make_plan(cfg["train"], cfg["optim"], workers, n)
    if plan.steps_per_epoch < 1:
        raise ConfigError(
            f"train.batch_size={t.batch_size}: more than the {n} training samples in "
            f"data.train={c.typed.data.train}; use a batch of at most {n - n % workers}"
        )
    cfg["run"]["name"] = c.typed.run.name or f"{c.typed.method.name}-{c.typed.data.name}-{config_hash(cfg)}"
    return plan


def run_name(cfg: Mapping[str, Any]) -> str:
    """The name `resolve` gives the run of `cfg`, without making or checking its data (the reproductions' ledger
    looks a run up by it). Raises ConfigError as `resolve` would for the config itself."""
    done = copy.deepcopy(dict(cfg))
    c = validate(done)
    from pipeline.build import complete_method  # torch, as check_method (in validate) loaded it

    done["method"].update(complete_method(c))
    return str(c.typed.run.name or f"{c.typed.method.name}-{c.typed.data.name}-{config_hash(done)}")


def _must_make(data: Mapping[str, Any], data_root: str) -> bool:
    """The chosen data (the data section) is embedded data (Spirograph, Photos) not made yet."""
    return managed_data(data, data_root) and not (_has_manifest(data["train"]) and _has_manifest(data["val"]))


def _has_manifest(path: str) -> bool:
    return "://" not in path and (Path(path) / "manifest.json").exists()


def _local_manifest(path: str) -> dict | None:
    try:
        return json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def prepare_data(data: Mapping[str, Any], data_root: str) -> dict:
    """Make the embedded data (Spirograph, Photos) if it is the chosen data and missing; check that embedded data
    is the data `data.generate` describes (_check_provenance); check every shard of both splits, refusing bad
    ones in one line or leaving them out with a warning naming them, as `data.on_bad_shard` says.

    Returns the train manifest (when shards were left out: `num_samples` without theirs, and `bad_shards`);
    ConfigError with one line naming the key when a split is missing, empty, other data or has bad shards.
    `data`: the config's data section; `data_root`: paths.data, where embedded data is made."""
    from pipeline.data.manifest import check_shards, describe_bad, shard_samples

    if _must_make(data, data_root):
        with _making(Path(data["train"]).parent):
            if _must_make(data, data_root):  # another job may have made it while this one waited
                for split in ("train", "val"):  # never let the generator rewrite a folder that holds other data
                    manifest = _local_manifest(data[split])
                    if manifest is not None:
                        _check_provenance(data, split, manifest)
                _make_embedded(data)
    policy = data.get("on_bad_shard", "fail")
    manifests = {}
    for split in ("train", "val"):
        try:
            manifest, uris, bad = check_shards(data[split])
        except (FileNotFoundError, ValueError, OSError) as e:
            raise ConfigError(f"data.{split}={data[split]}: {str(e).splitlines()[0]}") from None
        _check_provenance(data, split, manifest)
        if bad:
            if policy == "fail":
                raise ConfigError(
                    f"data.{split}={data[split]}: {len(bad)} bad shard(s) of {len(uris)}: "
                    f"{describe_bad(bad)}; remake them, or set data.on_bad_shard=skip to "
                    f"go on without them"
                )
            per_shard = dict(zip(uris, shard_samples(manifest)))
            lost = sum(per_shard[u] for u, _ in bad)
            if lost >= manifest["num_samples"]:
                raise ConfigError(f"data.{split}={data[split]}: every shard is bad: {describe_bad(bad)}")
            _log(
                f"data.{split}: skipping {len(bad)} bad shard(s) of {len(uris)} ({lost} samples; "
                f"data.on_bad_shard=skip): {describe_bad(bad, limit=20)}"
            )
            manifest = {**manifest, "num_samples": manifest["num_samples"] - lost, "bad_shards": [u for u, _ in bad]}
        manifests[split] = manifest
    return manifests["train"]


def _check_provenance(data: Mapping[str, Any], split: str, manifest: dict) -> None:
    """Generated embedded data (Spirograph, Photos) must be the data `data.generate` says (the run's params record
    it).

    Choice: the default folders are named by a hash of data.generate (conf/data/spirograph.yaml, photos.yaml), so
    changed settings generate new data into a folder of their own and old data is never reused for them; a
    folder that holds other data anyway (one given by hand as data.train/data.val, or made by make_shards with
    other settings) is refused in one line naming the differing key, never silently used or overwritten.
    Data that is not this dataset's generated data (its manifest's source says otherwise) is not checked."""
    source = manifest.get("source")
    generated = data.get("generate") and data["name"] in DATASETS
    if not generated or not isinstance(source, dict) or source.get("kind") != data["name"]:
        return
    folder, what = data[split], data["name"].capitalize()
    made = DATASETS[data["name"]]().generated_with(manifest, split)
    if made is None:
        raise ConfigError(
            f"data.{split}={folder}: {what} data made by another version of the generator "
            f"(source {json.dumps(source, sort_keys=True)}); remove it or point data.{split} elsewhere"
        )
    g = data["generate"]
    keys = [f"n_{split}", "seed", "size", "maxcount"]
    for key in keys + [k for k in g if k not in keys and k not in ("n_train", "n_val")]:  # a dataset's own too
        if made.get(key) != g[key]:
            raise ConfigError(
                f"data.generate.{key}={g[key]}: the {what} data in {folder} was made with "
                f"{key}={made.get(key)}; set data.generate.{key}={made.get(key)} to use it, or "
                f"point data.train and data.val at another folder"
            )


@contextmanager
def _making(root: Path) -> Iterator[None]:
    """One process at a time makes an embedded dataset's folder: two jobs started together (two `ray job submit`s,
    a sweep's trials) would write the same shards' temporary files. The other waits, saying so, then finds the
    data made."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for another job making {root}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _make_embedded(data: Mapping[str, Any]) -> None:
    """Generate the embedded dataset `data.name` into the managed folder."""
    g, name = data["generate"], data["name"]
    root = Path(data["train"]).parent
    _log(f"generating {name.capitalize()} shards in {root} ({g['n_train']} train / {g['n_val']} val)")
    DATASETS[name]().make_splits(root, g)
