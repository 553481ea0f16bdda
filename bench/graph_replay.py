"""One forward replayed as a CUDA graph against eager (bench/gpu_profile.py's graph step): the backbone and the
head of one batch whose inputs are on the device and whose attention is planned, so what the replay saves is the
host's launch work inside the forward."""

from __future__ import annotations

import torch
from kernel_bench import device_ms


def batch_forward(scorer, batch):
    """(forward, inputs) of a batch: forward() runs the backbone and the head as PackedRunner._launch does, on
    device inputs made once and an attention plan planned once (a first eager call)."""
    from score_batch.engine.run.heads import score_and_pool

    runner = scorer._runner
    device = runner.setup.device
    ids, positions, rows = (
        torch.from_numpy(a).to(device) for a in (batch.token_ids, batch.positions, batch.score_rows)
    )
    plan = runner.backend.plan(batch, device)
    max_position = int(batch.positions.max())
    causal = runner.setup.info.kind == "causal"

    def forward():
        hidden = runner.model.hidden_rows(ids, positions, max_position, plan, rows)  # [items, hidden]
        labels = runner._label_ids if causal else None
        return score_and_pool(
            hidden, runner.planner.cfg, runner.model.head, labels, runner.model.final_logit_softcap
        )[1]

    return forward


def graph_row(scorer, batch, repeats: int = 20) -> dict:
    """Eager and CUDA-graph milliseconds of one forward (medians), the saving, and the replay's scores against
    eager's (max |diff|, 0 when the graph replays the same kernels). Off CUDA, or where capture fails, the eager
    figure with the reason."""
    with torch.inference_mode():
        forward = batch_forward(scorer, batch)
        eager_scores = forward()  # plans attention on the first layer (host work, not capturable)
        row = {
            "packs": len(batch.packs),
            "tokens": batch.num_tokens,
            "eager_ms": round(device_ms(forward, repeats), 3),
        }
        if not torch.cuda.is_available() or eager_scores.device.type != "cuda":
            row["graph_refused"] = "CUDA graphs need a CUDA device"
            return row
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's docs ask
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = forward()
            graph.replay()
            torch.cuda.synchronize()
            row["graph_ms"] = round(device_ms(graph.replay, repeats), 3)
            row["graph_saves_ms"] = round(row["eager_ms"] - row["graph_ms"], 3)
            row["graph_of_eager"] = round(row["graph_ms"] / row["eager_ms"], 3)
            row["max_abs_diff_vs_eager"] = float((captured.float() - eager_scores.float()).abs().max())
        except Exception as error:  # e.g. a host copy or sync inside the forward: capture refuses it
            row["graph_refused"] = f"{type(error).__name__}: {str(error)[:500]}"
    return row
