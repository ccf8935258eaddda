"""DALI executor: applies sampled view parameters inside one DALI pipeline (its graphs: dali_graph.py).

Undecodable samples are dropped: a batch DALI rejects is retried without what PIL cannot decode, then one
sample at a time. A last batch smaller than batch_size is fed as is (external_source accepts any batch size up
to the maximum); inputs larger than batch_size are processed in chunks.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
from typing import Callable, Sequence

import numpy as np
import torch
from nvidia.dali.pipeline import Pipeline
from PIL import Image

from .dali_graph import _eval_pipeline, _view_feed, _views_pipeline
from .params import Params, eval_geometry, try_image_size, valid_samples
from .recipe import Recipe

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _autograph_files_removed():
    """DALI's conditionals compile through autograph, which writes each converted function to a
    `__autograph_generated_file*.py` in the temp folder and deletes it only at a clean interpreter exit, which a Ray
    worker never has: hundreds piled up in /tmp. The graph is built here with the temp folder pointed at one of its
    own, removed once the modules are loaded (they need their files no more)."""
    own = tempfile.mkdtemp(prefix="augssl-dali-")
    before = tempfile.tempdir
    tempfile.tempdir = own
    try:
        yield
    finally:
        tempfile.tempdir = before
        shutil.rmtree(own, ignore_errors=True)


def _pil_decodes(encoded: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(encoded)) as im:
            im.load()
    except Exception:
        return False
    return True


def _cuda_usable() -> bool:
    try:
        from nvidia.dali.backend import GetCUDADeviceCount  # type: ignore[attr-defined]  # missing from backend.pyi

        return torch.cuda.is_available() and GetCUDADeviceCount() > 0
    except Exception:
        return False


# ----------------------------------------------------------------------------- executor
class DaliExecutor:
    """Applies view params with DALI; __call__(encoded, params) -> (views, kept).

    views: one float32 [B', 3, size, size] tensor per view (on CPU, or the GPU when the
    pipeline runs there); kept: indices of the B' input samples that made it through.
    Undecodable samples are dropped and counted in `skipped`.
    """

    def __init__(self, recipe: Recipe, batch_size: int, device: str = "auto", num_threads: int = 1, seed: int = 0):
        if device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device must be auto|cpu|gpu, got {device!r}")
        self.recipe, self.batch_size = recipe, int(batch_size)
        self.num_threads, self.seed = int(num_threads), int(seed)
        self.gpu = device == "gpu" or (device == "auto" and _cuda_usable())
        if self.gpu and any(v.strong_ops for v in recipe.views):
            # strong_dali is a CPU graph fragment (Equalize runs as a python_function on the host)
            if device == "gpu":
                raise ValueError("recipes with strong-pool views run on the DALI CPU backend: use augment.device=cpu")
            log.warning("strong-pool views: DALI runs this recipe on its CPU backend")
            self.gpu = False
        self.skipped = 0
        self._eval_pipes: dict[int, Pipeline] = {}
        try:
            self._pipe = self._build(_views_pipeline, self.recipe, self.gpu)
        except RuntimeError as err:
            if device != "auto" or not self.gpu:
                raise
            log.warning("DALI GPU pipeline failed to build (%s); using the CPU backend", err)
            self.gpu = False
            self._pipe = self._build(_views_pipeline, self.recipe, self.gpu)
        self.device = "gpu" if self.gpu else "cpu"

    def _build(self, graph: Callable, *args) -> Pipeline:
        device_id = torch.cuda.current_device() if self.gpu else None  # None = DALI CPU-only mode
        with _autograph_files_removed():
            pipe = graph(
                *args,
                batch_size=self.batch_size,
                num_threads=self.num_threads,
                device_id=device_id,
                seed=self.seed,
                prefetch_queue_depth=1,
            )
            pipe.build()
        return pipe

    # -- running with corrupt-sample recovery
    def _run(
        self, pipe: Pipeline, feed: Callable[[np.ndarray], dict], encoded: Sequence[bytes], idx: np.ndarray
    ) -> list[torch.Tensor]:
        pipe.feed_input("encoded", [np.frombuffer(encoded[i], dtype=np.uint8) for i in idx])
        for name, arr in feed(idx).items():
            pipe.feed_input(name, arr)
        return [self._to_torch(out) for out in pipe.run()]

    def _run_robust(
        self, pipe: Pipeline, feed: Callable, encoded: Sequence[bytes], idx: np.ndarray
    ) -> tuple[list[torch.Tensor], np.ndarray]:
        """Run a batch; if DALI rejects it, drop what PIL cannot decode and retry; if that still
        fails, isolate the bad samples by running one at a time."""
        try:
            return self._run(pipe, feed, encoded, idx), idx
        except RuntimeError as err:
            first_error = err
        decodable = np.array([i for i in idx if _pil_decodes(encoded[i])], dtype=np.int64)
        if len(decodable) < len(idx) and len(decodable):
            try:
                return self._run(pipe, feed, encoded, decodable), decodable
            except RuntimeError:
                pass
        parts, good = [], []
        for i in decodable:
            try:
                parts.append(self._run(pipe, feed, encoded, np.array([i])))
                good.append(i)
            except RuntimeError:
                continue
        if len(decodable) and not good:
            raise first_error  # nothing works even alone: a bug, not bad data
        if not good:
            return [], np.zeros(0, dtype=np.int64)
        return [torch.cat(chunks) for chunks in zip(*parts)], np.asarray(good, dtype=np.int64)

    def _to_torch(self, batch) -> torch.Tensor:
        dense = batch.as_tensor()
        if not self.gpu:
            return torch.from_numpy(np.array(dense))  # copy: DALI reuses its buffers
        from nvidia.dali.plugin.pytorch import feed_ndarray

        out = torch.empty(dense.shape(), dtype=torch.float32, device=torch.device("cuda", torch.cuda.current_device()))
        feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream(out.device))
        return out

    def _run_all(
        self, pipe: Pipeline, feed: Callable, encoded: Sequence[bytes], candidates: np.ndarray, sizes: Sequence[int]
    ) -> tuple[list[torch.Tensor], np.ndarray]:
        chunks, kept = [], []
        for lo in range(0, len(candidates), self.batch_size):
            outs, ok = self._run_robust(pipe, feed, encoded, candidates[lo : lo + self.batch_size])
            if len(ok):
                chunks.append(outs)
                kept.append(ok)
        kept_all = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        self._drop_report(len(encoded), kept_all)
        if not chunks:
            dev = "cuda" if self.gpu else "cpu"
            return [torch.empty(0, 3, s, s, device=dev) for s in sizes], kept_all
        return [torch.cat(parts) for parts in zip(*chunks)], kept_all

    def _drop_report(self, n_in: int, kept: np.ndarray) -> None:
        n_bad = n_in - len(kept)
        if n_bad:
            self.skipped += n_bad
            log.warning("DALI executor: dropped %d undecodable sample(s) of %d (total %d)", n_bad, n_in, self.skipped)

    # -- public API
    def __call__(
        self, encoded: Sequence[bytes], params: Sequence[Params], sizes: Sequence[tuple[int, int]] | None = None
    ) -> tuple[list[torch.Tensor], np.ndarray]:
        if len(params) != self.recipe.n_views:
            raise ValueError(f"expected {self.recipe.n_views} params dicts, got {len(params)}")

        def feed(idx: np.ndarray) -> dict[str, np.ndarray]:
            return {
                f"v{v}_{k}": arr
                for v, (p, spec) in enumerate(zip(params, self.recipe.views))
                for k, arr in _view_feed(p, idx, spec).items()
            }

        candidates = np.flatnonzero(valid_samples(encoded, params, sizes))
        return self._run_all(self._pipe, feed, encoded, candidates, self.recipe.sizes)

    def eval_transform(self, encoded: Sequence[bytes], size: int | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """Resize short side + centre crop (geometry from params.eval_geometry), normalised."""
        size = int(size or self.recipe.size)
        if size not in self._eval_pipes:
            self._eval_pipes[size] = self._build(_eval_pipeline, self.recipe, size, self.gpu)
        sizes = [try_image_size(e) for e in encoded]
        geometry = {i: eval_geometry(hw[0], hw[1], size) for i, hw in enumerate(sizes) if hw}

        def feed(idx: np.ndarray) -> dict[str, np.ndarray]:
            g = np.array([geometry[i] for i in idx], dtype=np.int32).reshape(-1, 4)
            return {
                "resize_h": g[:, 0].astype(np.float32),
                "resize_w": g[:, 1].astype(np.float32),
                "start": np.ascontiguousarray(g[:, 2:]),
            }

        candidates = np.array(sorted(geometry), dtype=np.int64)
        (images,), kept = self._run_all(self._eval_pipes[size], feed, encoded, candidates, [size])
        return images, kept
