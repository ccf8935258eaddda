"""A PNG grid of augmented views: a few images of data.train, every view of the chosen recipe and joint
samplers, each annotated with the parameters that made it.

Examples:
  python jobs/gallery.py                                    # Spirograph views (the embedded default)
  python jobs/gallery.py augment=dino data=imagenet data.train=/data/imagenet-shards/train
  python jobs/gallery.py augment=mocov2 data=cifar10 augment.joint.crop.beta=2 gallery.out=joint.png
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import ConfigError, cli, fail  # noqa: E402


def main(argv: list[str]) -> int:
    cfg = cli(argv, __doc__)
    from pipeline.schema import validate

    try:  # the whole config, checked before any work; then the default Spirograph data is generated if missing
        validate(cfg)
        from pipeline.train.prepare import prepare_data

        prepare_data(cfg["data"], cfg["paths"]["data"])
    except ConfigError as e:
        fail(str(e))
    from pipeline.augment.gallery import write_gallery
    from pipeline.train.spec import gallery_path

    path = gallery_path(cfg["gallery"]["out"], cfg["paths"]["runs"], cfg["augment"]["name"], cfg["data"]["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    out = write_gallery(cfg, str(path), n_images=cfg["gallery"]["n_images"], seed=cfg["seed"])
    print(
        f"[gallery] {out['n_images']} images x {out['n_views']} views -> {out['path']}"
        + (f" ({out['skipped']} undecodable images skipped)" if out["skipped"] else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
