"""Write WebDataset shards for an ImageFolder tree, a CIFAR-10/100 python folder or Spirograph; or the embedded
detection set (shapes) as COCO-format JSON and images.

Usage:
  python jobs/make_shards.py source=imagefolder input=PATH output=DIR [split=train] [maxcount=1000] [seed=0]
  python jobs/make_shards.py source=cifar       input=PATH output=DIR [split=train|test] [maxcount=1000]
  python jobs/make_shards.py source=spirograph  output=DIR [n=5000] [n_val=1000] [seed=0] [size=32] [maxcount=1000]
  python jobs/make_shards.py source=shapes      output=DIR [+shapes.n_train=240 +shapes.size=128 ...]

imagefolder: input is the split folder (one sub-folder per class) or its parent holding <split>/; the samples
are shuffled across the shards with `seed` (recorded in the manifest), so every shard mixes the classes.
cifar: input is cifar-10-batches-py/ or cifar-100-python/ (or the folder containing it).
Shards go to output/<split>/ (spirograph: output/train and output/val). Reruns resume or no-op.
shapes: circles, squares and triangles with their boxes (the set jobs/detect.py makes on first use), in
output/shapes-<digest of its settings>/{train,val}/ (annotations.json + images/) with a manifest.json; the
settings (pipeline/detect/shapes.py's DEFAULTS) are overridden with +shapes.<key>=.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCES = ("imagefolder", "cifar", "spirograph", "shapes")
INT_KEYS = ("maxcount", "n", "n_val", "seed", "size")


class UsageError(Exception):
    pass


def check_args(args: dict) -> dict:
    """Validate the composed conf/shards.yaml before any work: source, paths, integers."""
    missing = [key for key in ("source", "output") if args[key] in (None, "???")]
    if missing:
        raise UsageError(
            f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} required: "
            f"python jobs/make_shards.py source={'|'.join(SOURCES)} output=DIR ... (--help)"
        )
    source = args["source"]
    if source not in SOURCES:
        raise UsageError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source in ("spirograph", "shapes") and args.get("input"):
        raise UsageError(f"source={source} takes no input=...")
    if source not in ("spirograph", "shapes"):
        if not args.get("input"):
            raise UsageError("missing input=...")
        if not os.path.exists(args["input"]):
            raise UsageError(f"input path does not exist: {args['input']}")
    for key in INT_KEYS:
        try:
            args[key] = int(args[key])
        except (TypeError, ValueError):
            raise UsageError(f"{key} must be an integer, got {args[key]!r}") from None
    return args


def main(argv: list[str]) -> int:
    from pipeline.config import cli

    try:
        args = check_args(cli(argv, __doc__, config_name="shards"))
    except SystemExit as done:  # --help, or a bad override already reported in one line
        return int(done.code or 0)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    if args["source"] == "shapes":
        from pathlib import Path

        from pipeline.detect.shapes import make_shapes

        try:
            out = make_shapes(Path(args["output"]), dict(args.get("shapes") or {}))
        except ValueError as err:
            print(f"error: shapes: {err}", file=sys.stderr)
            return 2
        manifest = json.loads((out / "manifest.json").read_text())
        for split, n in manifest["counts"].items():
            print(f"{split}: {n['images']} images, {n['objects']} boxes -> {out / split}/annotations.json and images/")
        return 0

    # each source's module is imported after the argument checks, and only the chosen one: Spirograph's imports torch,
    # which takes seconds
    try:
        if args["source"] == "spirograph":
            from pipeline.data.spirograph_shards import make_spirograph_splits

            manifests = make_spirograph_splits(
                args["output"], args["n"], args["n_val"], args["seed"], args["size"], args["maxcount"]
            )
        elif args["source"] == "cifar":
            from pipeline.data.cifar import make_cifar_split

            manifests = {
                args["split"]: make_cifar_split(args["input"], args["output"], args["split"], maxcount=args["maxcount"])
            }
        else:
            from pipeline.data.imagefolder import make_imagefolder_split

            manifests = {
                args["split"]: make_imagefolder_split(
                    args["input"], args["output"], args["split"], maxcount=args["maxcount"], seed=args["seed"]
                )
            }
    except (FileNotFoundError, ValueError) as err:  # bad input layout or split name
        print(f"make_shards: error: {err}", file=sys.stderr)
        return 1
    for split, manifest in manifests.items():
        print(
            f"{split}: {manifest['num_samples']} samples in {len(manifest['shards'])} shards "
            f"(skipped {manifest['skipped']}) -> {os.path.join(args['output'], split)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
