"""Semi-supervised fine-tuning (jobs/finetune.py): the subset's law, the schedule, the metrics, resume, the job."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import encode, fake_source, job_env
from pipeline.data.labelled import sample_name, select
from pipeline.data.reader import Split
from pipeline.data.shards import write_split
from pipeline.eval.finetune import (
    Classifier,
    Schedule,
    batches,
    finetune,
    mean_sq_norm,
    optimiser,
    precise_bn_,
    scores,
    stable_head_lr,
    train_view,
)
from pipeline.models.backbones import build_backbone

ROOT = Path(__file__).resolve().parents[2]
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200), (200, 30, 200)]


def _image(c: int, i: int, rng) -> bytes:
    img = rng.integers(0, 50, size=(20 + i % 7, 24, 3)).astype(np.int64) + np.array(COLOURS[c])
    return encode(np.clip(img, 0, 255).astype(np.uint8))


def colour_shards(root: Path, per_class: dict[str, int], seed: int = 0) -> Path:
    """Six colour classes (unbalanced counts allowed) as train/ and val/ shards: ImageFolder-style keys."""
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        samples = [
            {"__key__": f"{k:08d}_img{c}_{i}", "png": _image(c, i, rng), "cls": c}
            for k, (c, i) in enumerate((c, i) for c in range(6) for i in range(n + c * (split == "train")))
        ]
        write_split(
            iter(samples),
            root / split,
            maxcount=50,
            class_names=[f"c{c}" for c in range(6)],
            source="test",
            progress=False,
        )
    return root


def test_sample_names_drop_the_writers_ordinal():
    assert sample_name("00000012_n01440764_10026") == "n01440764_10026"
    assert sample_name("000123") == "000123" and sample_name("abc_def") == "abc_def"


def test_the_draw_is_class_balanced_seeded_and_listed_subsets_are_exact(tmp_path):
    root = colour_shards(tmp_path, {"train": 20})  # class c has 20 + c samples
    split, keys = select(str(root / "train"), "classification", None, 0.2, seed=3)
    counts = np.bincount(split.y, minlength=6)
    assert counts.tolist() == [4, 4, 4, 5, 5, 5]  # round(0.2 * (20 + c)) per class, not 27 over the whole set
    assert keys == sorted(keys) and len(keys) == len(split.encoded)
    assert select(str(root / "train"), "classification", None, 0.2, seed=3)[1] == keys
    assert select(str(root / "train"), "classification", None, 0.2, seed=4)[1] != keys
    # ImageNet's 1percent.txt style: file names with an extension, matched to the keys' names
    listed = ["img2_5.JPEG", "img0_0.JPEG", "00000003_img0_3"]
    split, keys = select(str(root / "train"), "classification", None, 0.1, seed=0, names=listed)
    assert sorted(keys) == ["00000000_img0_0", "00000003_img0_3", "00000046_img2_5"]  # class 2 starts at 20 + 21
    assert sorted(split.y.tolist()) == [0, 0, 2]
    with pytest.raises(ValueError, match=r"1 of the 2 listed samples are not in .* \(first: 'nope'\)"):
        select(str(root / "train"), "classification", None, 0.1, seed=0, names=["img0_1.png", "nope"])


def test_a_file_name_in_two_class_folders_must_be_listed_by_its_key(tmp_path):
    rng = np.random.default_rng(0)
    samples = [{"__key__": f"{k:08d}_same", "png": _image(k, 0, rng), "cls": k} for k in range(2)]
    write_split(iter(samples), tmp_path / "train", maxcount=10, class_names=["a", "b"], source="test", progress=False)
    with pytest.raises(ValueError, match="'same' names more than one sample"):
        select(str(tmp_path / "train"), "classification", None, 1.0, seed=0, names=["same.JPEG"])
    split, keys = select(str(tmp_path / "train"), "classification", None, 1.0, seed=0, names=["00000001_same"])
    assert keys == ["00000001_same"] and split.y.tolist() == [1]


def _schedule(**kw) -> Schedule:
    base = dict(
        epochs=4,
        batch_size=8,
        lr_backbone=0.01,
        lr_head=1.0,
        milestones=[2, 3],
        gamma=0.2,
        momentum=0.9,
        weight_decay=1e-4,
        crop_scale=[0.5, 1.0],
        flip=True,
    )
    return Schedule(**{**base, **kw})


def _colour_args(tmp_path: Path) -> dict:
    root = colour_shards(tmp_path, {"train": 6, "val": 3})
    train, _ = select(str(root / "train"), "classification", None, 1.0, seed=0)
    val, _ = select(str(root / "val"), "classification", None, 1.0, seed=0)
    return _data_args(train, val, "classification", out_dim=6, size=16)


def _data_args(train: Split, val: Split, task: str, out_dim: int, size: int) -> dict:
    """finetune's data arguments on the CPU, normalised about 0.5."""
    mean, std = [0.5] * 3, [0.25] * 3
    return dict(
        train=train,
        val=val,
        task=task,
        out_dim=out_dim,
        size=size,
        mean=mean,
        std=std,
        device=torch.device("cpu"),
        seed=0,
    )


def _net(width: int = 4):
    torch.manual_seed(0)
    return build_backbone({"backbone": "resnet18", "cifar_stem": True, "width": width})


def test_two_learning_rates_decay_by_gamma_after_each_milestone(tmp_path):
    model = Classifier(_net(), 6)
    opt = optimiser(model, _schedule())
    assert {id(p) for p in opt.param_groups[1]["params"]} == {id(p) for p in model.head.parameters()}
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["weight_decay"] == 1e-4
    seen = []
    finetune(
        _net(), s=_schedule(), log=lambda e, m: seen.append([m["lr_backbone"], m["lr_head"]]), **_colour_args(tmp_path)
    )
    expect = [[0.01 * 0.2 ** sum(e >= m for m in (2, 3)), 1.0 * 0.2 ** sum(e >= m for m in (2, 3))] for e in range(4)]
    assert np.allclose(seen, expect)


def test_the_head_lr_is_capped_where_a_least_squares_head_stops_being_stable():
    """Gradient descent on a linear least-squares head diverges past lr = 2 / lambda_max of the features' second
    moment; stable_head_lr caps at 2 / E||f||^2 <= 2 / lambda_max. Checked on the iteration itself: features with a
    large common component (lambda_max close to E||f||^2), lr at the cap converges, at twice lambda_max's bound it
    grows."""
    g = torch.Generator().manual_seed(0)
    f = 3.0 + 0.3 * torch.randn(64, 32, generator=g, dtype=torch.float64)  # mean-dominated, as pooled ReLU features
    y = torch.randn(64, 1, generator=g, dtype=torch.float64)
    sq = float((f**2).sum(1).mean())
    lam = float(torch.linalg.eigvalsh(f.T @ f / len(f)).max())
    assert lam <= sq and stable_head_lr(1.0, sq) == pytest.approx(2 / sq) and stable_head_lr(1e-9, sq) == 1e-9

    def final_loss(lr):
        w = torch.zeros(32, 1, dtype=torch.float64)
        for _ in range(200):
            w -= lr * 2 * f.T @ (f @ w - y) / len(f) / 2  # the gradient of mean((f w - y)^2) / 2
        return float(((f @ w - y) ** 2).mean())

    assert final_loss(stable_head_lr(1.0, sq)) < float((y**2).mean())
    assert final_loss(2.2 / lam) > 1e6


def test_the_cap_measures_features_as_training_sees_them_and_leaves_the_backbone_alone(tmp_path):
    net = _net(width=8)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(6, 3, 16, 16)
    sq = mean_sq_norm(net, x)
    net.train()
    with torch.no_grad():
        direct = float((net(x) ** 2).sum(1).mean())
    assert sq == pytest.approx(direct, rel=1e-5)
    net.load_state_dict(before)  # the direct forward above moved the running statistics; mean_sq_norm did not:
    net2 = _net(width=8)
    mean_sq_norm(net2, x)
    assert all(torch.equal(net2.state_dict()[k], before[k]) for k in before)


def test_precise_bn_sets_running_statistics_to_the_subsets_own(tmp_path):
    """The running mean: the subset's mean of the layer's input, however it is batched; the running variance: the
    batches' unbiased variances weighed by their sizes (the subset's own variance when it is one batch)."""
    from pipeline.augment.torch_exec import eval_transform

    encoded = _colour_args(tmp_path)["train"].encoded
    x, _ = eval_transform(encoded, 16, [0.5] * 3, [0.25] * 3)
    order = torch.randperm(len(encoded), generator=torch.Generator().manual_seed(0))
    for batch_size in [len(encoded), 8]:
        model = Classifier(_net(), 6)
        precise_bn_(model, encoded, 16, [0.5] * 3, [0.25] * 3, batch_size, torch.device("cpu"))
        seen = []
        hook = model.backbone.bn1.register_forward_hook(lambda m, i, o: seen.append(i[0]))
        model.eval()
        with torch.no_grad():
            model(x[order])
        hook.remove()
        a = seen[0]  # bn1's input does not depend on any BatchNorm
        parts = a.split(batch_size)
        var = sum(len(p) * p.var((0, 2, 3)) for p in parts) / len(a)
        assert torch.allclose(model.backbone.bn1.running_mean, a.mean((0, 2, 3)), rtol=1e-4, atol=1e-5)
        assert torch.allclose(model.backbone.bn1.running_var, var, rtol=1e-4, atol=1e-5)


def test_clipping_and_precise_bn_are_what_the_schedule_asks():
    """Each changes the scores: a regression's (continuous; six colour images' top-1 and top-5 can coincide)."""
    args = _spirograph_args(16, 8)
    one = dict(epochs=1, milestones=[])
    plain = finetune(_net(), s=_schedule(**one), **args)
    clipped = finetune(_net(), s=_schedule(**one, clip_grad_norm=1e-3), **args)
    precise = finetune(_net(), s=_schedule(**one, precise_bn=True), **args)
    assert clipped != plain and precise != plain


def test_batches_cover_every_sample_once_and_never_leave_one_alone():
    gen = torch.Generator().manual_seed(0)
    bs = batches(17, 8, gen)
    assert [len(b) for b in bs] == [8, 8]  # the lone 17th would break BatchNorm's training statistics
    assert len(set(torch.cat(bs).tolist())) == 16
    assert sorted(torch.cat(batches(16, 8, gen)).tolist()) == list(range(16))


def test_the_training_view_crops_flips_and_follows_its_generator():
    rng = np.random.default_rng(0)
    enc = [_image(0, i, rng) for i in range(4)]
    a = train_view(enc, 16, [0.5] * 3, [0.25] * 3, [0.2, 1.0], True, torch.Generator().manual_seed(1))
    b = train_view(enc, 16, [0.5] * 3, [0.25] * 3, [0.2, 1.0], True, torch.Generator().manual_seed(1))
    c = train_view(enc, 16, [0.5] * 3, [0.25] * 3, [0.2, 1.0], True, torch.Generator().manual_seed(2))
    assert a.shape == (4, 3, 16, 16) and torch.equal(a, b) and not torch.equal(a, c)
    # no crop, no flip: the un-augmented eval view
    from pipeline.augment.torch_exec import eval_transform

    plain = train_view(enc, 16, [0.5] * 3, [0.25] * 3, [1.0, 1.0], False, torch.Generator())
    assert torch.allclose(plain, eval_transform(enc, 16, [0.5] * 3, [0.25] * 3)[0])


class _Fixed(torch.nn.Module):
    """A 'model' whose outputs are given: scores() against a direct count."""

    def __init__(self, out: torch.Tensor):
        super().__init__()
        self.out, self.i = out, 0

    def forward(self, x):
        o = self.out[self.i : self.i + len(x)]
        self.i += len(x)
        return o


def test_top1_top5_and_regression_scores_match_a_direct_count():
    rng = np.random.default_rng(0)
    n = 40
    enc = [_image(0, i, rng) for i in range(n)]
    y = rng.integers(0, 8, n)
    out = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    res = scores(
        _Fixed(out), Split(enc, y, []), 16, [0.5] * 3, [0.25] * 3, "classification", torch.device("cpu"), batch_size=16
    )
    ranks = [(out[i] > out[i, y[i]]).sum().item() for i in range(n)]  # classes scored above the true one
    assert res["top1"] == pytest.approx(np.mean([r == 0 for r in ranks]))
    assert res["top5"] == pytest.approx(np.mean([r < 5 for r in ranks]))
    yr = rng.normal(size=(n, 2)).astype(np.float32)
    pred = torch.as_tensor(yr) + torch.tensor([0.5, -1.0])
    res = scores(_Fixed(pred), Split(enc, yr, ["m", "b"]), 16, [0.5] * 3, [0.25] * 3, "regression", torch.device("cpu"))
    assert res["mse_m"] == pytest.approx(0.25, rel=1e-5) and res["mse_b"] == pytest.approx(1.0, rel=1e-5)
    r2_b = 1 - 1.0 * n / ((yr[:, 1] - yr[:, 1].mean()) ** 2).sum()
    assert res["r2_b"] == pytest.approx(r2_b, rel=1e-4) and res["mse"] == pytest.approx(0.625, rel=1e-5)


def test_an_interrupted_finetuning_resumes_to_the_same_result(tmp_path):
    args = _colour_args(tmp_path)
    whole = finetune(_net(), s=_schedule(), ckpt=tmp_path / "a.pt", **args)

    def killed(epoch, metrics):
        if epoch == 3:  # after epoch 2's checkpoint, before epoch 3's
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune(_net(), s=_schedule(), ckpt=tmp_path / "b.pt", log=killed, **args)
    assert torch.load(tmp_path / "b.pt", weights_only=False)["epoch"] == 2
    logged = []
    resumed = finetune(_net(), s=_schedule(), ckpt=tmp_path / "b.pt", log=lambda e, m: logged.append(e), **args)
    assert logged == [3, 4] and resumed == pytest.approx(whole)
    assert torch.load(tmp_path / "b.pt", weights_only=False)["epoch"] == 4


def _finetune(tmp_path: Path, *args: str, timeout: int = 600):
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "finetune.py"), f"paths.root={tmp_path}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=job_env(),
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["label_fraction=0"], "error: label_fraction=0: expected a number > 0 and <= 1"),
        (["milestones=[30]"], "error: milestones=[30]: increasing epochs between 1 and epochs=20 - 1"),
        (["crop_scale=[0.5,0.1]"], "error: crop_scale=[0.5, 0.1]: auto or [lo, hi]"),
        (["lr_head=fast"], "error: lr_head=fast: auto or a number > 0"),
        (["subset=/no/such/list.txt"], "error: subset=/no/such/list.txt: no such file"),
        (["device=tpu"], "error: device=tpu: expected one of auto, cpu, cuda"),
        (["run=no-such-run"], "error: checkpoint 'no-such-run' is neither a path nor an MLflow run"),
    ],
)
def test_finetune_refuses_bad_input_in_one_line(tmp_path, args, needle):
    r = _finetune(tmp_path, "run=x", *args, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith(needle), r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_finetune_job_on_a_checkpoint_logs_both_backbones_and_a_rerun_trains_nothing(tmp_path):
    import mlflow

    from pipeline.config import compose_config

    root = colour_shards(tmp_path / "shards", {"train": 20, "val": 4})
    cfg = compose_config(
        [
            "data=cifar10",
            f"data.train={root / 'train'}",
            f"data.val={root / 'val'}",
            "data.name=colours",
            "model.width=4",
            f"paths.root={tmp_path}",
            "run.name=colour-run",
        ]
    )
    src = fake_source("resnet18", True, 4, cfg=cfg)
    ckpt = tmp_path / "ckpt" / "state.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save(src.state, ckpt)
    short = ["epochs=3", "milestones=[2]", "batch_size=8", "label_fraction=0.25", "lr_head=0.5"]
    r = _finetune(tmp_path, f"run={ckpt}", *short)
    assert r.returncode == 0, r.stderr[-4000:]
    n = sum(round(0.25 * (20 + c)) for c in range(6))
    assert f"[finetune] {n} labelled images (0.25 of the train split, seed 0), 24 validation images" in r.stdout
    assert "| pretrained |" in r.stdout and "| random |" in r.stdout
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("augssl").experiment_id])
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.tags["job"] == "finetune"
    assert run.info.run_name.startswith("colour-run-finetune-0.25-")
    assert all(0.0 <= m[f"finetune/{b}_{k}"] <= 1.0 for b in ("pretrained", "random") for k in ("top1", "top5"))
    inputs = {
        d.tags[0].value: d.dataset for d in client.get_run(run.info.run_id).inputs.dataset_inputs
    }  # the splits, the subset's count
    assert sorted(inputs) == ["training", "validation"] and f'"num_samples": {n},' in inputs["training"].profile
    assert [h.step for h in client.get_metric_history(run.info.run_id, "finetune/pretrained_loss")] == [1, 2, 3]
    lrs = {h.step: h.value for h in client.get_metric_history(run.info.run_id, "finetune/pretrained_lr_backbone")}
    assert [lrs[e] for e in (1, 2, 3)] == pytest.approx([0.01, 0.01, 0.002])  # x0.2 after epoch 2
    arts = [a.path for a in client.list_artifacts(run.info.run_id, "finetune")]
    assert arts == ["finetune/finetune.png", "finetune/subset.txt", "finetune/table.md"]
    subset = Path(client.download_artifacts(run.info.run_id, "finetune/subset.txt", str(tmp_path / "dl")))
    keys = subset.read_text().split()
    assert len(keys) == n and run.data.params["subset_size"] == str(n)
    again = _finetune(tmp_path, f"run={ckpt}", *short, timeout=120)
    assert again.returncode == 0 and "finished before" in again.stdout and "| pretrained |" in again.stdout
    # the logged subset, given back as a list, is the same subset: same data, a run of its own
    listed = _finetune(tmp_path, f"run={ckpt}", *short, f"subset={subset}", "baseline=false")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert f"{n} labelled images (listed in {subset}" in listed.stdout
    assert len(client.search_runs([run.info.experiment_id])) == 2


def _spirograph_split(n: int, seed: int) -> Split:
    """n Spirograph images (32 px) with their four targets, as the embedded dataset's shards hold them."""
    from pipeline.data.spirograph import render_flat, sample_params

    flat = sample_params(n, torch.Generator().manual_seed(seed))
    imgs = (render_flat(flat) * 255).round().byte().permute(0, 2, 3, 1).numpy()
    names = ["m", "b", "sigma", "f_r"]
    y = torch.stack([flat[k] for k in names], 1).numpy()
    return Split([encode(a) for a in imgs], y, names)


def _spirograph_args(n_train: int, n_val: int) -> dict:
    """finetune's data arguments for a regression of the four Spirograph targets at 32 px."""
    return _data_args(_spirograph_split(n_train, 0), _spirograph_split(n_val, 1), "regression", out_dim=4, size=32)


@pytest.mark.slow
def test_a_resnet50_finetunes_at_the_defaults_where_the_papers_head_lr_diverged():
    """The case that diverged (issue #49): ResNet-50 with its ImageNet stem (pooled features of E||f||^2 ~ 5,000)
    fine-tuned on 30 Spirograph images with conf/finetune.yaml's defaults: the loss stays finite and falls, the
    head lr capped; the same run with the head lr uncapped diverges, so the cap is what holds it."""
    from pipeline.eval.finetune_job import FineTuning
    from pipeline.eval.finetune_run import schedule

    ev = FineTuning()
    s = schedule(ev.job(ev.compose(["run=x"])).own, "regression")
    assert s.head_lr_cap and s.precise_bn and s.epochs == 20
    args = _spirograph_args(30, 60)

    def resnet50():
        torch.manual_seed(0)
        return build_backbone({"backbone": "resnet50", "cifar_stem": False, "width": 64})

    losses: list[float] = []
    res = finetune(resnet50(), s=s, log=lambda e, m: losses.append(m["loss"]), **args)
    assert len(losses) == 20 and all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses
    assert np.isfinite(res["mse"]) and res["r2"] > -1.0, res  # precise BN: the eval-mode statistics are the subset's
    with pytest.raises(FloatingPointError, match="lower the learning rates"):
        finetune(resnet50(), s=dataclasses.replace(s, head_lr_cap=False), **args)
