"""Export a pretraining run's backbone for another library.

  python jobs/export.py run=<MLflow run id or checkpoint> format=detectron2 [out=<file.pkl>]
  python jobs/export.py run=<...> format=torchvision [out=<file.pt>]

format=detectron2 writes the .pkl detectron2's DetectionCheckpointer loads (MODEL.WEIGHTS=<file.pkl>): detectron2's
key names, `matching_heuristics` (res5 lands in the backbone or in the C4 box head alike) and, under "augssl", the
MODEL.RESNETS layout, MODEL.PIXEL_MEAN/STD and INPUT.FORMAT the backbone was trained with. A narrow or CIFAR-stem
ResNet needs the project's registered builders (pipeline.detect.d2_backbone), which the detection job uses.
The file is logged to a child run of the pretraining run (when it is in this MLflow store).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import cli, fail  # noqa: E402


def main(argv: list[str]) -> int:
    cfg = cli(argv, __doc__, config_name="export")
    from pipeline.detect.export import FORMATS

    fmt, out = cfg["format"], cfg["out"]
    if fmt not in FORMATS:
        fail(f"format={fmt}: expected one of {', '.join(sorted(FORMATS))}")
    if out and Path(out).suffix != FORMATS[fmt]:
        fail(f"out={out}: format={fmt} writes a {FORMATS[fmt]} file")
    import mlflow

    from pipeline import tracking
    from pipeline.detect.convert import resnet_config
    from pipeline.detect.export import export
    from pipeline.eval.source import load_source
    from pipeline.store import Store

    tracking.setup(Store.of(cfg))
    try:
        src = load_source(str(cfg["run"]))
        resnet_config(src.cfg["model"])
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    name = src.cfg["run"].get("name") or Path(src.ref).parent.name
    path = Path(out) if out else Path(cfg["paths"]["runs"]) / "export" / f"{name}{FORMATS[fmt]}"
    export(src, fmt, path.resolve())
    print(f"[export] {fmt}: {path.resolve()}", flush=True)
    if src.run_id is not None:
        child = tracking.start_child(src.run_id, f"export:{src.run_id}:{fmt}", f"{name}-export-{fmt}", job="export")
        try:
            mlflow.log_params({"format": fmt, "source": src.ref})
            mlflow.log_artifact(str(path.resolve()), "export")
        except BaseException as e:
            tracking.end_failed(e)
            raise
        mlflow.end_run()
        print(f"[export] logged to MLflow run {child} (a child of {src.run_id})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
