import pytest
import torch

from pipeline.train.precision import autocast, resolve_precision
from pipeline.train.step import _Pending


def _views(start, n):
    x = torch.arange(start, start + n, dtype=torch.float32)
    images = [x.view(n, 1, 1, 1), -x.view(n, 1, 1, 1)]
    params = [{"crop": torch.stack([x, x + 1], 1)}, {"crop": torch.stack([-x, x], 1), "flip": x > start}]
    return images, params


def test_pending_tops_up_short_batches_in_order():
    p = _Pending(4)
    p.add(*_views(0, 3))  # a batch that lost one corrupt sample
    assert len(p) == 3
    p.add(*_views(10, 4))
    assert len(p) == 7
    (a, b), (pa, pb) = p.take()
    assert a.flatten().tolist() == [0, 1, 2, 10] and torch.equal(b, -a)
    # each view's parameters stay aligned with its images
    assert pa["crop"][:, 0].tolist() == [0, 1, 2, 10] and pb["crop"][:, 1].tolist() == [0, 1, 2, 10]
    assert pb["flip"].tolist() == [False, True, True, False]
    assert len(p) == 3
    (a2, _), (pa2, _) = p.take()
    assert a2.flatten().tolist() == [11, 12, 13] and pa2["crop"][:, 1].tolist() == [12, 13, 14]
    p.add(*_views(0, 0))  # a batch where every sample was dropped adds nothing
    assert len(p) == 0


def test_precision_choice():
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) == "fp32"
    assert resolve_precision("auto", cpu) in ("bf16", "fp32")
    with pytest.raises(ValueError):
        resolve_precision("fp8", cpu)
    with autocast("fp32", cpu):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    if resolve_precision("auto", cpu) == "bf16":
        with autocast("bf16", cpu):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_newest_on_disk_takes_the_newest_loadable_state(tmp_path):
    """Resume prefers the newest complete state.pt in the run folder, local or remote, and skips one cut short by an
    interrupt."""
    import os

    from pipeline import checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert checkpoint.newest_on_disk(tmp_path / "absent") is None
    for epoch in range(3):
        folder = tmp_path / f"checkpoint_{epoch}"
        folder.mkdir()
        checkpoint.save(folder, model, opt, epoch=epoch, step=10 * epoch, config={})
        os.utime(folder / "state.pt", (1000 + epoch, 1000 + epoch))
    assert checkpoint.newest_on_disk(tmp_path)["epoch"] == 2
    # the newest is the one Ray restored: nothing newer to load (and it is not read again)
    assert checkpoint.newest_on_disk(tmp_path, str(tmp_path / "checkpoint_2")) is None
    assert checkpoint.newest_on_disk(tmp_path, str(tmp_path / "checkpoint_1"))["epoch"] == 2
    newest = tmp_path / "checkpoint_2" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # a copy cut short
    os.utime(newest, (2000, 2000))
    assert checkpoint.newest_on_disk(tmp_path)["epoch"] == 1
    # the same through a pyarrow URI (trainer.storage=s3://..., the code path of every remote store)
    assert checkpoint.newest_on_disk(tmp_path.as_uri())["epoch"] == 1
    assert checkpoint.newest_on_disk(tmp_path.as_uri(), str(tmp_path / "checkpoint_1")) is None  # Ray's path form
    assert checkpoint.newest_on_disk((tmp_path / "absent").as_uri()) is None


def test_state_to_resume_takes_rays_checkpoint_or_a_newer_one_on_disk(tmp_path):
    """A restarted worker resumes from Ray's registered checkpoint, unless a newer complete one lies on disk (an
    interrupt while reporting it); nothing at all: a fresh start."""
    import os

    import ray.train

    from pipeline import checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert checkpoint.state_to_resume(None, tmp_path) is None
    for epoch in range(2):
        folder = tmp_path / f"checkpoint_{epoch}"
        folder.mkdir()
        checkpoint.save(folder, model, opt, epoch=epoch, step=10 * epoch, config={})
        os.utime(folder / "state.pt", (1000 + epoch, 1000 + epoch))
    registered = ray.train.Checkpoint.from_directory(str(tmp_path / "checkpoint_0"))
    assert checkpoint.state_to_resume(registered, tmp_path)["epoch"] == 1  # the newer one on disk
    assert checkpoint.state_to_resume(registered, tmp_path / "elsewhere")["epoch"] == 0  # Ray's own
    latest = ray.train.Checkpoint.from_directory(str(tmp_path / "checkpoint_1"))
    assert checkpoint.state_to_resume(latest, tmp_path)["step"] == 10


def test_curve_panels_group_what_was_logged():
    from pipeline.build import drawn_curves
    from pipeline.curve_panels import panels

    keys = [
        "train/loss",
        "train/lr",
        "train/cocor_consistency",
        "train/cocor_target_l1",
        "train/cocor_sim_l1",
        "train/cocor_target_l3",
        "knn/r2_m",
        "knn/time_s",
        "train/cocor_outer_loss",
        "system/cpu_utilization_percentage",
    ]
    p = panels(keys, *drawn_curves("moco", {"cocor": {}}))
    assert list(p.values()) == [
        ["train/loss", "train/cocor_consistency"],
        ["knn/r2_m"],
        ["train/cocor_sim_l1", "train/cocor_target_l1", "train/cocor_target_l3"],
    ]
    assert panels(["train/lr"]) == {}
    (cocor,) = drawn_curves("moco", {"cocor": {}})[1]  # a length's target solid, its similarity dashed, one colour
    assert cocor.style("train/cocor_sim_l3") == ("--", "C3") and cocor.style("train/cocor_target_l3") == ("-", "C3")
    # what a method and a plug-in declare is drawn with the loss; nothing else names them
    assert drawn_curves("vicreg", {"invclr": {}}) == (["invariance", "variance", "covariance", "invclr_penalty"], [])


def test_progress_lines_print_a_plain_line_every_interval_and_no_redraws(capsys):
    """Where the driver's console is a file, rank 0's progress is a line every `every` seconds, never a redraw."""
    from pipeline.progress import ProgressLines

    now = [100.0]
    p = ProgressLines("epoch 1/3", total=1000, every=30.0, clock=lambda: now[0])
    for i in range(10):  # 100 images every 10 s: a line at 30, 60 and 90 s, none at 100 s (the epoch is done)
        if i == 6:
            p.set_description("epoch 1/3 loss 2.5")
        now[0] += 10.0
        p.update(100)
    p.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[train] epoch 1/3: 300/1000 img (30 %), 10 img/s, 70 s left",
        "[train] epoch 1/3: 600/1000 img (60 %), 10 img/s, 40 s left",
        "[train] epoch 1/3 loss 2.5: 900/1000 img (90 %), 10 img/s, 10 s left",
    ]
