"""Weighted k-nearest-neighbour monitor (Wu et al. 2018): classification accuracy or regression R^2."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _neighbours(bank: torch.Tensor, query: torch.Tensor, k: int, temperature: float):
    sim = F.normalize(query, dim=1) @ F.normalize(bank, dim=1).t()
    top_sim, top_idx = sim.topk(min(k, bank.shape[0]), dim=1)
    return (top_sim / temperature).exp(), top_idx


def _class_votes(w: torch.Tensor, neighbour_y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The class with the largest sum of weights w over each query's neighbours (their classes neighbour_y)."""
    votes = torch.zeros(w.shape[0], num_classes, dtype=w.dtype)
    return votes.scatter_add_(1, neighbour_y, w).argmax(1)


def _weighted_mean(w: torch.Tensor, neighbour_y: torch.Tensor) -> torch.Tensor:
    """Each query's neighbours' targets averaged with weights w (normalised per query)."""
    w = w / w.sum(1, keepdim=True)
    return (w.unsqueeze(-1) * neighbour_y).sum(1)


def knn_classify(
    bank: torch.Tensor,
    bank_y: torch.Tensor,
    query: torch.Tensor,
    k: int = 200,
    temperature: float = 0.1,
    num_classes: int | None = None,
) -> torch.Tensor:
    """Predicted class per query: the class with the largest sum of exp(cos/T) over the k neighbours."""
    w, idx = _neighbours(bank, query, k, temperature)
    return _class_votes(w, bank_y[idx], num_classes or int(bank_y.max()) + 1)


def knn_regress(
    bank: torch.Tensor, bank_y: torch.Tensor, query: torch.Tensor, k: int = 20, temperature: float = 0.1
) -> torch.Tensor:
    """Predicted targets per query: the exp(cos/T)-weighted mean of the k neighbours' targets."""
    w, idx = _neighbours(bank, query, k, temperature)
    return _weighted_mean(w, bank_y[idx])


def r2_score(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Coefficient of determination per column."""
    ss_res = ((pred - y) ** 2).sum(0)
    ss_tot = ((y - y.mean(0)) ** 2).sum(0)
    return 1 - ss_res / ss_tot


def knn_metrics(
    bank, bank_y, query, query_y, task: str, k: int, temperature: float, names: list[str] | None = None
) -> dict[str, float]:
    """{"knn_top1": acc} for classification; {"knn_r2": mean R^2, "knn_r2_<name>": ...} for regression."""
    if task == "classification":
        return _knn_scores(knn_classify(bank, bank_y, query, k, temperature), query_y, task, names)
    return _knn_scores(knn_regress(bank, bank_y, query, k, temperature), query_y, task, names)


def _knn_scores(pred: torch.Tensor, query_y: torch.Tensor, task: str, names: list[str] | None) -> dict[str, float]:
    if task == "classification":
        return {"knn_top1": float((pred == query_y).float().mean())}
    r2 = r2_score(pred, query_y)
    out = {"knn_r2": float(r2.mean())}
    for name, v in zip(names or [], r2.tolist()):
        out[f"knn_r2_{name}"] = v
    return out


@torch.no_grad()
def knn_streamed(
    bank,
    bank_y,
    query,
    query_y,
    task: str,
    k: int = 200,
    temperature: float = 0.07,
    num_classes: int | None = None,
    names: list[str] | None = None,
    chunk: int = 65536,
    block: int = 4096,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """knn_metrics for a bank too large for memory (a memory-mapped array): the bank is read once, a chunk at a
    time, and each block of queries keeps its running top-k against it, so memory holds a chunk, the queries'
    top-k and one block x chunk of similarities. Same votes as knn_classify / knn_regress."""
    import numpy as np

    q = F.normalize(torch.as_tensor(np.array(query)).float(), dim=1)
    k = min(k, len(bank))
    top_sim = torch.full((len(q), k), -2.0)
    top_idx = torch.zeros((len(q), k), dtype=torch.long)
    for start in range(0, len(bank), chunk):
        b = F.normalize(torch.as_tensor(np.array(bank[start : start + chunk])).float().to(device), dim=1)
        for i in range(0, len(q), block):
            sim = q[i : i + block].to(device) @ b.t()
            s, j = sim.topk(min(k, sim.shape[1]), dim=1)
            both_s = torch.cat([top_sim[i : i + block].to(device), s], 1)
            both_i = torch.cat([top_idx[i : i + block].to(device), j + start], 1)
            best_s, pos = both_s.topk(k, dim=1)
            top_sim[i : i + block], top_idx[i : i + block] = best_s.cpu(), both_i.gather(1, pos).cpu()
    w = (top_sim / temperature).exp()
    neighbours_y = torch.as_tensor(np.array(bank_y))[top_idx]
    qy = torch.as_tensor(np.array(query_y))
    if task == "classification":
        c = num_classes or int(max(int(np.max(bank_y)), int(qy.max()))) + 1
        return _knn_scores(_class_votes(w, neighbours_y, c), qy, task, names)
    return _knn_scores(_weighted_mean(w, neighbours_y.float()), qy.float(), task, names)
