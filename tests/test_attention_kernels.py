"""Kernel choices that matter on CUDA, checked on the CPU: the SDPA arguments under GQA + mask, no transformers
mask hook, no device→host sync inside a forward, FlashInfer's out= buffer and split-KV settings, flex buffers."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig
from score_batch.engine.attention import HF_ATTENTION_NAME, softcap, split
from score_batch.engine.attention.flashinfer import FlashInferPlan, SplitKv
from score_batch.engine.attention.flashinfer_plan import build_metadata
from score_batch.engine.attention.flex import FlexBackend, bucket_tokens
from score_batch.engine.attention.sdpa import SdpaBackend
from score_batch.engine.attention.split import SplitBackend
from score_batch.engine.plan.batching import collate
from score_batch.engine.plan.packing import ItemRef, mis_pack, single_pack
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer

LABELS = (" to", " the")
GROUPS = [
    Group("I pledge allegiance", [" to", " the flag of", "", " to the United States of America"]),
    Group("Tokyo is a city in", [" Japan", " yes"]),
]
# Ops that read a device value back to the host: on CUDA each one is a stream synchronization.
SYNC_OPS = (
    "aten::nonzero",
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::masked_select",
)


def _record_sdpa(monkeypatch) -> list[dict]:
    """Replace softcap's SDPA by a recorder of (key heads, kwargs) that returns zeros of the query's shape."""
    calls = []

    def fake(query, key, value, **kwargs):
        calls.append({"key_heads": key.shape[-3], "value_heads": value.shape[-3], **kwargs})
        return torch.zeros_like(query)

    monkeypatch.setattr(softcap.F, "scaled_dot_product_attention", fake)
    return calls


def _qkv(device: str, dtype=torch.bfloat16, heads=16, kv_heads=8, n=32, d=64):
    q = torch.empty(1, heads, n, d, device=device, dtype=dtype)  # [1, heads, tokens, head_dim]
    k, v = (torch.empty(1, kv_heads, n, d, device=device, dtype=dtype) for _ in range(2))
    return q, k, v


def test_gqa_with_a_mask_off_the_cpu_expands_kv_for_the_memory_efficient_kernel(monkeypatch):
    # A meta tensor stands for a CUDA one: the choice reads the device type, not the hardware.
    calls = _record_sdpa(monkeypatch)
    q, k, v = _qkv("meta")
    mask = torch.ones(32, 32, dtype=torch.bool, device="meta")
    softcap.attention(q, k, v, mask, None, None)
    assert calls == [
        {
            "key_heads": 16,
            "value_heads": 16,
            "attn_mask": mask,
            "is_causal": False,
            "scale": None,
            "enable_gqa": False,
        }
    ]


@pytest.mark.parametrize(
    ("device", "dtype", "masked", "native"),
    [
        ("cpu", torch.float32, True, True),  # the CPU's fused kernel takes GQA with a mask
        ("cpu", torch.bfloat16, False, True),
        ("meta", torch.bfloat16, True, False),  # CUDA + mask: memory-efficient kernel, no GQA support
        ("meta", torch.bfloat16, False, True),  # CUDA causal 16-bit: flash takes GQA
        ("meta", torch.float32, False, False),  # CUDA fp32: no flash, so expand for memory-efficient
    ],
)
def test_native_gqa_choice(device, dtype, masked, native, monkeypatch):
    calls = _record_sdpa(monkeypatch)
    q, k, v = _qkv(device, dtype)
    mask = torch.ones(32, 32, dtype=torch.bool, device=device) if masked else None
    softcap.attention(q, k, v, mask, 0.125, None)
    assert calls[0]["enable_gqa"] is native
    assert calls[0]["key_heads"] == calls[0]["value_heads"] == (8 if native else 16)
    assert calls[0]["is_causal"] is (not masked)


def test_expanded_kv_equals_native_gqa_on_the_cpu(monkeypatch):
    torch.manual_seed(0)
    q = torch.randn(2, 6, 20, 16)  # [batch, heads, tokens, head_dim]
    k, v = torch.randn(2, 2, 2, 20, 16).unbind(0)  # [batch, kv_heads=2, tokens, head_dim]: 3 query heads each
    mask = torch.rand(20, 20) > 0.3
    mask |= torch.eye(20, dtype=torch.bool)
    native = softcap.attention(q, k, v, mask, None, None)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    monkeypatch.setattr(softcap, "native_gqa", lambda *args: False)
    expanded = softcap.attention(q, k, v, mask, None, None)
    assert torch.allclose(native, reference, atol=1e-6)
    assert torch.allclose(expanded, reference, atol=1e-6)


def test_no_mask_function_is_registered_and_transformers_builds_no_mask(qwen3_causal, monkeypatch):
    import transformers.masking_utils as masking

    calls = collections.Counter()

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        masking, "find_packed_sequence_indices", counting("packed", masking.find_packed_sequence_indices)
    )
    for name, fn in list(masking.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.items()):
        monkeypatch.setitem(masking.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, name, counting(name, fn))
    for backend in ("split", "sdpa"):
        scorer = Scorer.from_pretrained(
            qwen3_causal,
            EngineConfig(device="cpu", backend=backend, scoring=ScoringConfig(label_tokens=LABELS)),
        )
        calls.clear()  # the plain-HF reference below builds its masks (eager): count ours only
        results = scorer.score(GROUPS)
        assert HF_ATTENTION_NAME not in masking.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
        assert calls == {}, calls  # neither find_packed_sequence_indices nor any mask builder ran
        label_ids = [tokenizer(str(qwen3_causal)).encode(t, add_special_tokens=False)[0] for t in LABELS]
        for group, result in zip(GROUPS, results):
            for item, scores in zip(group.items, result.scores):
                expected, _ = reference_scores(
                    qwen3_causal, "causal", reference_sequence(qwen3_causal, group.query, item), label_ids
                )
                assert max_abs_diff(scores, expected) <= 1e-5


@pytest.mark.parametrize("backend", ["split", "sdpa", "flex"])
def test_a_forward_reads_nothing_back_to_the_host(qwen3_causal, backend):
    """No op that synchronizes a CUDA stream (nonzero, item, …) runs while a planned batch is scored."""
    scorer = Scorer.from_pretrained(
        qwen3_causal, EngineConfig(device="cpu", backend=backend, scoring=ScoringConfig(label_tokens=LABELS))
    )
    plan = scorer.plan(GROUPS)
    scorer.run(plan)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        scorer.run(plan)
    names = collections.Counter(event.name for event in profile.events())
    assert names["aten::linear"] > 0  # the profile saw the forward
    assert {name: names[name] for name in SYNC_OPS if names[name]} == {}


def _mixed_batch():
    rng = np.random.default_rng(0)
    packs = [single_pack(list(rng.integers(1, 90, 9)), ItemRef(9, 0))]
    for g in range(3):
        items = [list(rng.integers(1, 90, int(rng.integers(0, 7)))) for _ in range(2 + g)]
        packs.append(
            mis_pack(list(rng.integers(1, 90, 5 + g)), items, [ItemRef(g, i) for i in range(len(items))], 99)
        )
    return collate(packs)


def test_split_builds_its_row_indices_on_the_host_and_matches_sdpa():
    batch = _mixed_batch()
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    q = torch.randn(1, 4, batch.num_tokens, 8)
    k, v = torch.randn(2, 1, 2, batch.num_tokens, 8).unbind(0)
    plan = SplitBackend(cpu).plan(batch, cpu)
    output = plan.attend(q, k, v, None, None)
    expected = SdpaBackend(cpu).plan(batch, cpu).attend(q, k, v, None, None)
    rows = torch.from_numpy(batch.segments != -2)  # delimiter rows are never read
    assert (output - expected)[:, rows].abs().max() <= 1e-6
    for layout in plan._pack_layouts(None):
        if layout.item_index is not None:
            assert layout.item_rows.dtype == layout.item_slots.dtype == torch.int64


@pytest.mark.parametrize(("dtype", "bound"), [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_split_merged_parts_equal_the_masked_path(monkeypatch, dtype, bound):
    """Items by two log-sum-exp-merged mask-free parts = items by one masked SDPA over [query ; own] keys."""
    batch = _mixed_batch()
    cpu = torch.device("cpu")
    torch.manual_seed(1)
    q = torch.randn(1, 4, batch.num_tokens, 8, dtype=dtype)
    k, v = torch.randn(2, 1, 2, batch.num_tokens, 8, dtype=dtype).unbind(0)
    calls = []
    lse = split._attention_with_lse
    monkeypatch.setattr(split, "_attention_with_lse", lambda *a: calls.append(a[-1]) or lse(*a))
    merged = SplitBackend(cpu).plan(batch, cpu).attend(q, k, v, 0.3, None)
    assert calls and set(calls) == {False, True}  # the query part and the own-item part ran
    monkeypatch.setattr(split, "merged_parts_apply", lambda *args: False)
    masked = SplitBackend(cpu).plan(batch, cpu).attend(q, k, v, 0.3, None)
    assert len(calls) == sum(1 for p in batch.packs if (p.segments >= 0).any()) * 2  # no call the second time
    assert merged.dtype == dtype
    assert (merged.float() - masked.float()).abs().max() <= bound


def test_bucketed_flex_pads_into_buffers_made_once_per_batch():
    batch = _mixed_batch()
    cpu = torch.device("cpu")
    flex = FlexBackend(cpu, compile=False)
    flex.compiled = True  # bucketed lengths, as when compiled, with the eager kernel (fast on the CPU)
    plan = flex.plan(batch, cpu)
    length = bucket_tokens(batch.num_tokens)
    assert length > batch.num_tokens
    reference = SdpaBackend(cpu).plan(batch, cpu)
    rows = torch.from_numpy(batch.segments != -2)
    buffers = None
    for layer in range(3):
        torch.manual_seed(layer)
        q = torch.randn(1, 4, batch.num_tokens, 8)
        k, v = torch.randn(2, 1, 2, batch.num_tokens, 8).unbind(0)
        output = plan.attend(q, k, v, None, None)
        assert output.shape == (1, batch.num_tokens, 4, 8)
        assert (output - reference.attend(q, k, v, None, None))[:, rows].abs().max() <= 1e-5
        current = {key: buffer.data_ptr() for key, buffer in plan._buffers.items()}
        assert len(current) == 3 and all(b.shape[2] == length for b in plan._buffers.values())
        assert buffers is None or current == buffers  # the same three buffers serve every layer
        buffers = current
        assert all(float(b[:, :, batch.num_tokens :].abs().max()) == 0 for b in plan._buffers.values())


class FakeWrapper:
    """BatchPrefillWithPagedKVCacheWrapper's plan/run signatures of FlashInfer 0.6.6 (flashinfer/prefill.py)."""

    def __init__(self):
        self.plans, self.runs = [], []

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len=0,
        max_item_len_ptr=None,
        seq_lens=None,
        seq_lens_q=None,
        block_tables=None,
        max_token_per_sequence=None,
        max_sequence_kv=None,
        fixed_split_size=None,
        disable_split_kv=False,
    ):
        self.plans.append({name: value for name, value in locals().items() if name != "self"})

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None,
            skip_softmax_threshold_scale_factor=None):  # fmt: skip
        k_cache, v_cache = paged_kv_cache
        assert out is not None and out.shape == (*q.shape[:-1], v_cache.shape[-1]) and out.dtype == q.dtype
        out.fill_(len(self.runs))
        self.runs.append(out)
        return out


@pytest.mark.parametrize("split_kv", [SplitKv(), SplitKv(disable=True), SplitKv(fixed_size=64)])
def test_flashinfer_plans_once_and_reuses_one_output_buffer(split_kv):
    batch = _mixed_batch()
    wrapper = FakeWrapper()
    plan = FlashInferPlan(wrapper, build_metadata(batch), torch.device("cpu"), split_kv)
    n = batch.num_tokens
    outputs = []
    for layer in range(3):
        q = torch.randn(1, 4, n, 64, dtype=torch.bfloat16)  # [1, heads, tokens, head_dim]
        k, v = torch.randn(2, 1, 2, n, 64, dtype=torch.bfloat16).unbind(0)
        out = plan.attend(q, k, v, None, None)
        assert out.shape == (1, n, 4, 64) and float(out[0, 0, 0, 0]) == layer
        outputs.append(out)
    assert len(wrapper.plans) == 1
    assert len({o.data_ptr() for o in wrapper.runs}) == 1  # one buffer for every layer
    planned = wrapper.plans[0]
    assert planned["disable_split_kv"] is split_kv.disable
    assert planned["fixed_split_size"] == split_kv.fixed_size
    assert planned["causal"] is True and planned["page_size"] == 1 and planned["num_qo_heads"] == 4


def test_a_plan_waits_for_the_previous_plans_copy_to_the_device():
    """FlashInfer's plan() stages its schedule in one page-locked buffer per wrapper and queues the copy: the next
    batch's plan (made while the previous batch runs) must wait until that copy ran, and nothing longer."""
    from score_batch.engine.attention.flashinfer import PlanCopies

    events = []

    class Event:  # torch.cuda.Event's record/synchronize, recorded
        def record(self):
            self.number = sum(e.startswith("record") for e in events) + 1
            events.append(f"record {self.number}")

        def synchronize(self):
            events.append(f"wait {self.number}")

    class Wrapper(FakeWrapper):
        def plan(self, *args, **kwargs):
            events.append(f"plan {len(self.plans) + 1}")
            super().plan(*args, **kwargs)

    wrapper, copies, batch = Wrapper(), PlanCopies(event=Event), _mixed_batch()
    n = batch.num_tokens
    for _ in range(3):  # three batches through one wrapper, each planned on its first layer only
        plan = FlashInferPlan(wrapper, build_metadata(batch), torch.device("cpu"), plan_copies=copies)
        for _ in range(2):
            q = torch.randn(1, 4, n, 64, dtype=torch.bfloat16)
            k, v = torch.randn(2, 1, 2, n, 64, dtype=torch.bfloat16).unbind(0)
            plan.attend(q, k, v, None, None)
    assert events == ["plan 1", "record 1", "wait 1", "plan 2", "record 2", "wait 2", "plan 3", "record 3"]
