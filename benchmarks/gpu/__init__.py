"""GPU throughput of the project against bare, hand-tuned torch: one command, ratios measured in one run, written
to docs/performance.md with the command, the device, the torch version and the date.

    python benchmarks/gpu                         # cuda if present, else cpu; ResNet-50, 224 px, batch 256
    python benchmarks/gpu --e2e                   # also (c): jobs/pretrain.py end to end from JPEG shards
    python benchmarks/gpu --quick --device cpu --out /tmp/perf.md   # smoke run (ResNet-18 width 8, 64 px)
    python benchmarks/gpu --rows mocov2 co2       # a subset of the step rows
    python benchmarks/gpu --help                  # every flag (--batch, --iters, --rounds, --workdir, ...)

(a) View executor: views/s of the batched view executor (`make_executor("batched", recipe, batch, torch_device=...)`)
    per recipe (mocov2, simclr, byol, clsa, cocor) on generated 500x375 JPEGs, parameters drawn by
    `sample_views` inside the timed region (the loop pays for both), against the images/s the project's step of
    that recipe's framework consumes (target: >= 2x).
(b) Training step: images/s of a bare, tuned loop written here with torch and torchvision only (two-view forward
    of torchvision's ResNet + projection MLP + the framework's loss + backward + fused SGD, EMA with
    `_foreach_lerp_`, no host syncs) against the project's step (`build_method(cfg)`, `build_optimizer`, and the
    loop's own step, `pipeline.train.step.Stepper`: lr schedule, views to the device, `optimisation_step` = autocast,
    total_loss(), zero_grad, backward, before_optimizer_step, optimizer.step, update_momentum, the plug-ins' own
    optimisers, then the per-step float() of the logged values). Rows: MoCo v2, SimCLR, BYOL, SimSiam, MoCo v3
    and DINO on ViT-S/16 (AdamW), and the seed plug-ins on their experiment's framework (co2,
    clsa, cocor on MoCo v2; invclr on SimCLR). bf16 autocast where the device has it, channels_last and
    cudnn.benchmark on CUDA, pre-made views already on the device. After warm-up steps, the two loops of a row
    are timed in turn (rounds of back-to-back steps, synchronised at both ends; best round kept). Targets:
    project >= 0.97x bare; CO2 <= 1.02x its baseline's step time, CLSA (single strong crop) <= 1.32x, InvCLR <= 2x
    its SimCLR baseline.
(c) End to end (--e2e): `jobs/pretrain.py` in a subprocess on a generated ImageFolder of 500x375 JPEGs sharded with
    `jobs/make_shards.py`, MoCo v2 with (b)'s settings; train/epoch_images_per_s of its last epoch (from its MLflow
    store) against (b)'s project MoCo v2 step fed pre-made tensors.

Both loops of a row compute the same thing: same networks (widths from the composed config), same views (random
tensors of each view's size, with parameters drawn by the project's sampler for 500x375 images), same optimiser
settings. MoCo runs with method.bn_splits=1 (the multi-GPU layout: shuffle by permutation, plain BN) and the
ImageNet queue of 65536 keys (256 with --quick). CoCor uses its learned target on a generated labelled split
(plugin.cocor.labelled_fraction=1.0 of a small split, so its labelled batch is the configured 64): the project
decodes that labelled batch from JPEG in every step, the bare loop reads pre-made tensors.
"""

# The parts: rows.py (the rows, their configs and targets, the settings, the project's step), data.py (generated
# JPEGs and shards), bare/ (the bare loops, one module per framework family), measure.py (sections a, b and c timed),
# report.py (docs/performance.md's text), cli.py (the command line; __main__.py runs it).

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
