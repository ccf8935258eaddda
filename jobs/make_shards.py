"""Write WebDataset shards for an ImageFolder tree, a CIFAR-10/100 python folder or Spirograph.

Usage:
  python jobs/make_shards.py source=imagefolder input=PATH output=DIR [split=train] [maxcount=1000]
  python jobs/make_shards.py source=cifar       input=PATH output=DIR [split=train|test] [maxcount=1000]
  python jobs/make_shards.py source=spirograph  output=DIR [n=5000] [n_val=1000] [seed=0] [size=32] [maxcount=1000]

imagefolder: input is the split folder (one sub-folder per class) or its parent holding <split>/.
cifar: input is cifar-10-batches-py/ or cifar-100-python/ (or the folder containing it).
Shards go to output/<split>/ (spirograph: output/train and output/val). Reruns resume or no-op.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCES = ("imagefolder", "cifar", "spirograph")
INT_KEYS = ("maxcount", "n", "n_val", "seed", "size")
ALLOWED = {
    "imagefolder": {"source", "input", "output", "split", "maxcount"},
    "cifar": {"source", "input", "output", "split", "maxcount"},
    "spirograph": {"source", "output", "n", "n_val", "seed", "size", "maxcount"},
}


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> dict:
    """key=value arguments -> dict with ints converted and defaults filled in."""
    args: dict = {}
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {item!r}")
        args[key] = value
    source = args.get("source")
    if source not in SOURCES:
        raise UsageError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    unknown = set(args) - ALLOWED[source]
    if unknown:
        raise UsageError(f"unknown arguments for source={source}: {', '.join(sorted(unknown))}")
    required = ("output",) if source == "spirograph" else ("input", "output")
    for key in required:
        if not args.get(key):
            raise UsageError(f"missing {key}=...")
    defaults = {"split": "train", "maxcount": "1000", "n": "5000", "n_val": "1000", "seed": "0", "size": "32"}
    for key, value in defaults.items():
        if key in ALLOWED[source]:
            args.setdefault(key, value)
    for key in INT_KEYS:
        if key in args:
            try:
                args[key] = int(args[key])
            except ValueError:
                raise UsageError(f"{key} must be an integer, got {args[key]!r}") from None
    if "input" in args and not os.path.exists(args["input"]):
        raise UsageError(f"input path does not exist: {args['input']}")
    return args


def main(argv: list[str]) -> int:
    if not argv or "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        return 0
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"make_shards: error: {err}", file=sys.stderr)
        return 2

    from pipeline.data import shards  # after argument checks: importing torch takes seconds

    try:
        if args["source"] == "spirograph":
            manifests = shards.make_spirograph_splits(
                args["output"], args["n"], args["n_val"], args["seed"], args["size"], args["maxcount"])
        elif args["source"] == "cifar":
            manifests = {args["split"]: shards.make_cifar_split(
                args["input"], args["output"], args["split"], maxcount=args["maxcount"])}
        else:
            manifests = {args["split"]: shards.make_imagefolder_split(
                args["input"], args["output"], args["split"], maxcount=args["maxcount"])}
    except (FileNotFoundError, ValueError) as err:  # bad input layout or split name
        print(f"make_shards: error: {err}", file=sys.stderr)
        return 1
    for split, manifest in manifests.items():
        print(f"{split}: {manifest['num_samples']} samples in {len(manifest['shards'])} shards "
              f"(skipped {manifest['skipped']}) -> {os.path.join(args['output'], split)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
