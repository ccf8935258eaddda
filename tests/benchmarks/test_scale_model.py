"""benchmarks/scale_model.py: each formula against a hand computation, the model sizes against an independently built
torchvision ResNet-50 with MoCo v2's head, the checkpoint prediction against a file pipeline/checkpoint.py writes,
the command line, and docs/scale.md against what the defaults generate."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scale_model.py"


def _load():
    spec = importlib.util.spec_from_file_location("scale_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sm = _load()


@pytest.fixture(scope="module")
def sizes() -> dict:
    return sm.model_sizes(sm.OVERRIDES)  # ResNet-50 MoCo v2, built once on the CPU


# ----------------------------------------------------------------------------- the formulas, by hand
def test_moco_rate_is_three_quarters_of_the_supervised_rate_at_a_two_forward_backward():
    # supervised: 1 forward + 1 backward = 3 forwards an image; MoCo v2: 2 forwards + 1 backward = 4 a pair
    assert sm.moco_rate(2000.0, 2.0) == pytest.approx(1500.0)
    assert sm.moco_rate(1000.0, 1.0) == pytest.approx(1000.0 * 2 / 3)


def test_compute_and_backward_time():
    assert sm.compute_time(32, 1600.0) == pytest.approx(0.02)
    assert sm.backward_time(0.02, 2.0) == pytest.approx(0.01)  # 2 of the step's 4 forward-equivalents


def test_ring_allreduce_bytes_for_8_gpus_and_1_mb():
    assert sm.ring_allreduce_bytes(1e6, 8) == pytest.approx(1.75e6)  # 2 * 7 / 8 MB
    assert sm.ring_allreduce_bytes(1e6, 1) == 0


def test_ring_allgather_bytes():
    assert sm.ring_allgather_bytes(1000, 4) == 3000  # the three other GPUs' chunks


def test_link_bandwidth_is_nvlink_within_a_node_and_the_network_past_it():
    assert sm.link_bandwidth(8, 8, nvlink_bytes_s=200e9, node_bytes_s=50e9) == 200e9
    assert sm.link_bandwidth(16, 8, nvlink_bytes_s=200e9, node_bytes_s=50e9) == 50e9


def test_transfer_and_step_time():
    assert sm.transfer_time(100e6, 50e9) == pytest.approx(2e-3)
    assert sm.step_time(0.017, 0.002, 0.003) == pytest.approx(0.022)


def test_exposed_allreduce_hides_a_share_capped_at_the_backward():
    assert sm.exposed_allreduce(0.010, 0.008, 0.5) == pytest.approx(0.005)  # half of 10 ms hidden
    assert sm.exposed_allreduce(0.010, 0.008, 1.0) == pytest.approx(0.002)  # only 8 ms of backward to hide in


@pytest.mark.parametrize(
    "allreduce,exchange,fixed", [(200e6, 100e6, 0.0), (200e6, 0.0, 0.0), (2e9, 0.0, 0.0), (200e6, 1e6, 0.5e-3)]
)
def test_bandwidth_for_budget_gives_the_budgeted_exposed_time(allreduce, exchange, fixed):
    t_c, t_b, overlap, budget = 0.02, 0.01, 0.5, 0.1
    bw = sm.bandwidth_for_budget(allreduce, exchange, t_c, t_b, overlap, budget, fixed)
    exposed = sm.exposed_allreduce(allreduce / bw, t_b, overlap) + exchange / bw + fixed
    assert exposed == pytest.approx(budget * t_c)


def test_bandwidth_for_budget_is_infinite_when_the_fixed_time_alone_exceeds_the_budget():
    assert sm.bandwidth_for_budget(200e6, 1e6, 0.02, 0.01, 0.5, 0.1, fixed_s=0.002) == math.inf


def test_epochs_for_stall_is_the_fewest_that_keep_the_write_within_the_share():
    k = sm.epochs_for_stall(0.02, 0.74, 3.0)
    assert 0.74 / (k * 3.0 + 0.74) <= 0.02 < 0.74 / ((k - 1) * 3.0 + 0.74)
    assert sm.epochs_for_stall(0.02, 0.74, 600.0) == 1


def test_steps_per_epoch_as_prepare_counts_them():
    assert sm.steps_per_epoch(1_281_167, 64, 32) == (1_281_167 // 64) // 32 == 625


def test_read_rate_decode_cpus_write_time():
    assert sm.read_bytes_s(1000.0, 110_000 + 1792) == pytest.approx(111.792e6)
    assert sm.decode_cpus(1852.5, 51.1) == pytest.approx(36.2524, rel=1e-4)
    assert sm.write_time(370e6, 500e6) == pytest.approx(0.74)
    assert sm.lost_work(90.0) == 90.0


def test_scenario_at_64_gpus_by_hand(sizes):
    args = sm.parse([])
    args.checkpoint_every = 1
    c = sm.scenario(64, 32, sizes, args)
    t_c = 32 / (2470 * 3 / 4)
    node_bytes_s = 400e9 / 8
    t_ar = 2 * 63 / 64 * sizes["grad_bytes"] / node_bytes_s
    # shuffle_node (auto on 8 nodes of 8): 7 of 8 bf16 views and their keys over NVLink, the queue's keys between nodes
    row = 3 * 224 * 224 * 2 + 128 * 4
    t_exchange = 32 * 7 / 8 * row / 230e9 + 63 * 32 * 128 * 4 / node_bytes_s
    assert c["key_bn"] == "shuffle_node"
    assert c["exchange_bytes"] == pytest.approx(32 * 7 / 8 * row + 63 * 32 * 128 * 4)
    assert c["t_exchange"] == pytest.approx(t_exchange)
    assert c["t_compute"] == pytest.approx(t_c)
    assert c["t_step"] == pytest.approx(t_c + t_ar / 2 + t_exchange)
    # the budgeted link: NVLink's share is fixed, the all-reduce and the queue's keys scale with the node's network
    bw = c["bandwidth_needed_bytes_s"]
    exposed = sm.exposed_allreduce(2 * 63 / 64 * sizes["grad_bytes"] / bw, t_c / 2, 0.5) + 63 * 32 * 512 / bw
    assert exposed + 32 * 7 / 8 * row / 230e9 == pytest.approx(0.1 * t_c)
    assert c["cpus_per_gpu"] == pytest.approx(32 / c["t_step"] / 51.1)
    assert c["node_read_bytes_s"] == pytest.approx(8 * 32 / c["t_step"] * (110e3 + 1792))
    assert c["epoch_s"] == pytest.approx(625 * c["t_step"])


# ----------------------------------------------------------------------------- the model, counted
def test_parameter_count_matches_torchvision_resnet50_and_a_mocov2_head(sizes):
    from torchvision.models import resnet50

    backbone = resnet50()
    backbone.fc = nn.Identity()
    head = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 128))
    n_backbone = sum(p.numel() for p in backbone.parameters())
    n_head = sum(p.numel() for p in head.parameters())
    assert (sizes["backbone"], sizes["head"]) == (n_backbone, n_head)
    assert sizes["trainable"] == sizes["momentum"] == n_backbone + n_head
    assert sizes["grad_bytes"] == 4 * (n_backbone + n_head) and sizes["grad_dtypes"] == ["float32"]
    assert sizes["queue_shape"] == (65536, 128)

    buffers = sum(b.numel() * b.element_size() for b in backbone.buffers())  # BN running stats, counters
    params = 4 * (n_backbone + n_head)
    # online + key encoder (each with BN buffers) + SGD momentum + queue keys + its int64 pointer
    assert sizes["checkpoint_bytes"] == 3 * params + 2 * buffers + 65536 * 128 * 4 + 8


def test_checkpoint_prediction_matches_the_file_checkpoint_save_writes(tmp_path):
    from pipeline import checkpoint
    from pipeline.build import build_method
    from pipeline.config import compose_config
    from pipeline.train.optim import build_optimizer

    cfg = compose_config(
        ["method=mocov2", "model.backbone=resnet18", "model.width=8", "method.bn_splits=1", "method.queue_size=256"]
    )
    method = build_method(cfg)
    optimizer = build_optimizer(method.online, cfg["optim"], 0.1)
    for p in method.online.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # SGD's momentum buffers exist from the first step on, as in every saved checkpoint
    path = checkpoint.save(tmp_path, method, optimizer, epoch=0, step=1, config=cfg)

    predicted = sm.checkpoint_bytes(method)
    tensors = len(checkpoint.method_state(method)) + len(optimizer.state)
    overhead = path.stat().st_size - predicted
    assert 0 < overhead < 1024 * tensors, (path.stat().st_size, predicted, tensors)  # keys, cfg, zip records


# ----------------------------------------------------------------------------- the command and the doc
def test_the_command_writes_a_report_with_its_command_and_the_three_gpu_counts(tmp_path):
    out = tmp_path / "scale.md"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert f"`python benchmarks/scale_model.py --out {out}`" in text
    for n in (8, 64, 256):
        assert f"| {n} GPUs" in text
    assert "The one GPU run so far" in text and "--moco-img-s" in text
    assert text == r.stdout


def test_docs_scale_md_is_what_the_defaults_generate(sizes):
    generated = sm.run(["--out", "docs/scale.md"])["text"]
    hint = "regenerate it: python benchmarks/scale_model.py --out docs/scale.md"
    assert (ROOT / "docs" / "scale.md").read_text() == generated, hint


def test_every_number_is_finite(sizes):
    result = sm.run([])
    for c in result["weak"] + result["fixed"]:
        for key, value in c.items():
            if isinstance(value, float):
                assert math.isfinite(value) and value >= 0, key


def test_key_bn_modes_are_the_codes_less_auto():
    from pipeline.methods import key_bn

    assert set(sm.KEY_BN_MODES) == set(key_bn.MODES) - {"auto"}


@pytest.mark.parametrize(
    "n,per_node,mode", [(1, 8, "split"), (8, 8, "shuffle"), (64, 8, "shuffle_node"), (256, 8, "shuffle_node"),
                        (4, 1, "shuffle"), (12, 8, "shuffle_node"), (9, 8, "shuffle")]
)  # fmt: skip
def test_auto_mode_is_what_key_bn_resolve_picks_on_the_layout(n, per_node, mode):
    from pipeline.methods.key_bn import resolve

    nodes = sm.node_list(n, per_node)
    assert len(nodes) == n and max(nodes) + 1 == math.ceil(n / per_node)
    assert sm.auto_mode(n, per_node) == resolve("auto", nodes) == mode


def test_auto_mode_asks_the_code(monkeypatch):
    from pipeline.methods import key_bn

    monkeypatch.setattr(key_bn, "resolve", lambda mode, nodes: "sync")
    assert sm.auto_mode(64, 8) == "sync"


def test_tables_a_and_b_run_auto_with_its_mode_exchange(sizes):
    """Every column of A and B: the mode key_bn.resolve picks for its layout, that mode's key_exchange bytes and
    seconds, and the step table C gives that mode."""
    result = sm.run([])
    a = result["args"]
    seen = set()
    for c in result["weak"] + result["fixed"]:
        mode = c["key_bn"]
        seen.add(mode)
        assert mode == sm.auto_mode(c["n"], a.gpus_per_node)
        sent, t = sm.key_exchange(mode, c["n"], c["per_gpu_batch"], sizes, a)
        assert (c["exchange_bytes"], c["t_exchange"]) == (pytest.approx(sent), pytest.approx(t))
        same = sm.mode_scenario(mode, c["n"], c["per_gpu_batch"], sizes, a)
        assert c["t_step"] == pytest.approx(same["t_step"])
    assert seen == {"shuffle", "shuffle_node"}  # 8 GPUs: one node; 64 and 256: nodes of 8
    for i, c in enumerate(result["weak"]):  # table C runs A's per-GPU batch: A's column is its auto mode's row
        assert c["efficiency"] == pytest.approx(result["modes"][(c["key_bn"], False)][i]["efficiency"])


def test_the_report_rows_show_auto_and_no_mode_that_does_not_exist():
    text = sm.run([])["text"]
    assert (
        "| `method.key_bn=auto` runs (key_bn.resolve on this layout) | `shuffle` | `shuffle_node` | `shuffle_node` |"
        in text
    )
    table_c = text.split("## C:")[1].split("\n## ")[0]
    rows = [line.split("|")[1].strip() for line in table_c.splitlines() if line.startswith("| `")]
    assert {r.split("`")[1] for r in rows} == set(sm.KEY_BN_MODES) and len(rows) == 2 * len(sm.KEY_BN_MODES)
    assert "gather`" not in text and "not implemented" not in text and "#29" not in text
    assert "python benchmarks/gpu" in text


def test_key_bn_modes_by_hand_at_64_gpus(sizes):
    """Each mode's bytes from its formula written out here, and the targets for the default multi-node mode."""
    a = sm.parse([])
    a.checkpoint_every = 1
    b, n, g = 32, 64, 8
    v2, key = 3 * 224 * 224 * 2, 128 * 4
    queue = (n - 1) * b * key
    sent, t = sm.key_exchange("shuffle", n, b, sizes, a)
    assert sent == pytest.approx(b * (n - 1) / n * (v2 + key) + queue)
    assert t == pytest.approx((b * (n - g) / n * (v2 + key) * g + queue) / 50e9)  # a node's NICs: every GPU's share
    sent, _ = sm.key_exchange("shuffle_node", n, b, sizes, a)
    assert sent == pytest.approx(b * (g - 1) / g * (v2 + key) + queue)
    sent, t = sm.key_exchange("sync", n, b, sizes, a)
    layers = sizes["bn_channels"]
    assert len(layers) == 53  # ResNet-50's BatchNorms (the MoCo v2 head has none)
    assert sent == pytest.approx(sum(2 * (n - 1) / n * (2 * c + 1) * 8 for c in layers) + queue)
    assert t > len(layers) * (10 + 2 * 3 * 5) * 1e-6  # 8 nodes: 2 log2(8) = 6 hops of 5 us on a 10 us floor
    assert sm.key_exchange("split", n, b, sizes, a)[0] == pytest.approx(queue)
    # the targets: shuffle_node (auto across nodes) >= 85 % at 64 and >= 70 % at 256, <= 0.5 GB a GPU at 256
    assert sm.mode_scenario("shuffle_node", 64, b, sizes, a)["efficiency"] >= 0.85
    at256 = sm.mode_scenario("shuffle_node", 256, b, sizes, a)
    assert at256["efficiency"] >= 0.70 and at256["bytes"] <= 0.5e9
    assert sm.mode_scenario("shuffle", 8, b, sizes, a)["efficiency"] >= 0.94  # one node
    with pytest.raises(ValueError):
        sm.key_exchange("gather", n, b, sizes, a)


def test_official_exchange_by_hand_and_what_the_text_says_of_it(sizes):
    """facebookresearch/moco's exchange: the global batch's float32 views and two gathers of the keys."""
    a = sm.parse([])
    a.checkpoint_every = 1
    sent, t = sm.official_exchange(64, 32, sizes, a)
    assert sent == pytest.approx(63 * 32 * (3 * 224 * 224 * 4 + 2 * 128 * 4))
    assert t == pytest.approx(sent / 50e9)
    result = sm.run([])
    eff = {c["n"]: c["efficiency"] for c in result["official"]}
    assert 0.35 < eff[64] < 0.45 and eff[256] < eff[64] < result["weak"][1]["efficiency"]
    assert f"{eff[64]:.0%} at 64 GPUs" in result["text"]
