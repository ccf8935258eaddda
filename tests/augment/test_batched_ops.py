"""The batched executor's device path has a fixed number of ops and nothing that waits for the device.

Counted with a TorchDispatchMode over one call of the executor (decoding included: libjpeg's one op per image is
torchvision's `image` namespace, the decoder's own work, not the path's): the aten ops must not grow with the batch,
and none of them may be one that brings a value back to the host (`.item()`, `nonzero`, `unique`, ...). The strong
pool's ops grow with the number of distinct ops drawn per slot (at most the pool's 14 per slot), not with the batch.
On CUDA (gpu marker) the same call runs under torch.cuda.set_sync_debug_mode("error").
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import encode, natural
from pipeline.augment.batched import BatchedExecutor
from pipeline.augment.decode import decode_batch
from pipeline.augment.params import header_sizes, sample_views
from pipeline.augment.view_makers import image_recipe
from pipeline.config import compose_config

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

# ops whose result the host must wait for (they read a device value, or size their output by one)
SYNC_OPS = (
    "_local_scalar_dense",
    "nonzero",
    "unique",
    "masked_select",
    "is_nonzero",
    "aten.equal",
    "repeat_interleave",
)
MAX_OPS = 150  # MoCo v2's two views, the issue's bound


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def aten(self) -> Counter[str]:
        return Counter({k: v for k, v in self.ops.items() if k.startswith("aten.")})


def recipe_of(name: str, size: int = 24):
    return image_recipe(compose_config([f"augment={name}", "data=imagenet", f"data.image_size={size}"])["augment"])


def batch(n: int, seed: int = 0) -> list[bytes]:
    """Small JPEGs and PNGs of several sizes: the op count does not depend on the pixels."""
    return [encode(natural(28 + i % 7, 36 + i % 5, seed + i), "PNG" if i % 4 == 3 else "JPEG") for i in range(n)]


def count_call(recipe, n: int) -> CountOps:
    encoded = batch(n)
    sizes = header_sizes(encoded)
    params = sample_views(encoded, recipe, np.random.default_rng(0), sizes)
    ex = BatchedExecutor(recipe, "cpu")
    with CountOps() as counter:
        views, kept = ex(encoded, params, sizes)
    assert len(kept) == n and all(v.shape[0] == n for v in views)
    return counter


@pytest.mark.parametrize("name", ["mocov2", "simclr", "byol", "dino"])
def test_op_count_does_not_grow_with_the_batch(name):
    recipe = recipe_of(name)
    small, large = count_call(recipe, 64), count_call(recipe, 256)
    assert small.aten == large.aten, set(small.aten.items()) ^ set(large.aten.items())
    # the per-sample path this replaced made ~2,000 ops at B = 16; the decoder's own ops are one per image
    assert sum(large.ops.values()) - sum(large.aten.values()) <= 256
    if name == "mocov2":
        assert sum(large.aten.values()) <= MAX_OPS, sorted(large.aten.items(), key=lambda kv: -kv[1])


@pytest.mark.parametrize("name", ["mocov2", "byol", "dino", "invclr", "clsa", "cocor"])
def test_no_op_waits_for_the_device(name):
    counter = count_call(recipe_of(name), 64)
    waiting = {k: v for k, v in counter.ops.items() if any(s in k for s in SYNC_OPS)}
    assert not waiting, waiting


def test_the_per_sample_path_would_be_seen():
    """The counter is not blind: the torch executor's per-sample crops grow with the batch and it syncs."""
    from pipeline.augment.torch_exec import TorchExecutor

    recipe = recipe_of("mocov2")
    counts = []
    for n in (16, 32):
        encoded = batch(n)
        params = sample_views(encoded, recipe, np.random.default_rng(0))
        with CountOps() as counter:
            TorchExecutor(recipe)(encoded, params)
        counts.append(sum(counter.aten.values()))
        assert any(s in k for k in counter.ops for s in SYNC_OPS)
    assert counts[1] > counts[0] + 100


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["mocov2", "byol", "dino", "clsa_multi", "cocor"])
def test_views_on_cuda_do_not_synchronise(name):
    """JPEGs decoded by nvJPEG and PNGs decoded on the host, then the views, under sync debug mode "error": any
    blocking copy or device-to-host read on the path raises."""
    recipe, device = recipe_of(name, 64), torch.device("cuda")
    encoded = batch(64)
    params = sample_views(encoded, recipe, np.random.default_rng(0))
    images, kept = decode_batch(encoded, range(len(encoded)), device)
    ex = BatchedExecutor(recipe, device)
    ex.views_of(images, [{k: v[kept] for k, v in p.items()} for p in params])  # warm-up: cuBLAS, cuDNN handles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        views = ex.views_of(images, [{k: v[kept] for k, v in p.items()} for p in params])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(v.device.type == "cuda" and v.shape[0] == len(kept) for v in views)
    assert all(torch.isfinite(v).all() for v in views)
