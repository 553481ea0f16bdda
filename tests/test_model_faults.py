"""Damaged model directories and the model's position limit: clear ScoringInputErrors and row errors.

Model files: a truncated, empty, foreign or unreadable weight file, a directory without weights,
a sharded index naming a missing shard, a checkpoint that lacks or misshapes tensors, and a damaged
tokenizer.json / config.json are refused with a message naming the file (exit 2 through the CLI),
before any long load. Position limit: an item whose reference sequence would pass the model's
max_position_embeddings is a row error unless ScoringConfig.truncate cuts it to fit.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig, ScoringInputError
from score_batch.engine.errors import SettingError
from score_batch.engine.model.setup import load_planner
from score_batch.engine.model.source import check_weight_files, resolve_model_dir
from score_batch.engine.plan.planner import Planner
from tests.reference import max_abs_diff, reference_scores, reference_sequence, tokenizer
from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl

LABELS = (" to", " the")
CONFIG = EngineConfig(backend="sdpa", scoring=ScoringConfig(label_tokens=LABELS))


def _weights(model_dir):
    return model_dir / "model.safetensors"


def _truncate(file, keep):
    data = file.read_bytes()
    file.write_bytes(data[: keep(len(data))])


# --- weight files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: _truncate(f, lambda n: n // 2),  # cut mid-data
        lambda f: _truncate(f, lambda n: 20),  # cut inside the header
        lambda f: _truncate(f, lambda n: 0),  # empty
        lambda f: f.write_bytes(b"<html>404 Not Found</html>" * 10),  # a saved error page
    ],
    ids=["truncated-data", "truncated-header", "empty", "not-safetensors"],
)
def test_damaged_safetensors_is_named(qwen3_causal, copy_model, damage):
    model_dir = copy_model(qwen3_causal)
    damage(_weights(model_dir))
    with pytest.raises(
        ScoringInputError, match="model.safetensors in .* is truncated or not a safetensors file"
    ):
        Scorer.from_pretrained(model_dir, CONFIG)


def test_damage_is_found_before_the_tokenizer_or_weights_load(qwen3_causal, copy_model):
    model_dir = copy_model(qwen3_causal)
    _truncate(_weights(model_dir), lambda n: n - 1)
    with pytest.raises(ScoringInputError, match="truncated or not a safetensors file"):
        # what a dry run does, no weights loaded: the run's entry resolves the directory once, then load_planner
        load_planner(resolve_model_dir(model_dir), CONFIG)
    with pytest.raises(ScoringInputError, match="truncated"):
        check_weight_files(model_dir)


def test_broken_link_to_a_weight_file(qwen3_causal, copy_model):
    # A hub cache snapshot whose blob was deleted: the link is there, the file is not.
    model_dir = copy_model(qwen3_causal)
    _weights(model_dir).unlink()
    _weights(model_dir).symlink_to("../../blobs/0123abcd")
    with pytest.raises(ScoringInputError, match="model.safetensors in .* is a broken link"):
        Scorer.from_pretrained(model_dir, CONFIG)


def test_weight_file_that_is_a_directory(qwen3_causal, copy_model):
    model_dir = copy_model(qwen3_causal)
    _weights(model_dir).unlink()
    _weights(model_dir).mkdir()
    with pytest.raises(ScoringInputError, match="model.safetensors in .* is not a regular file"):
        Scorer.from_pretrained(model_dir, CONFIG)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_weight_file(qwen3_causal, copy_model):
    model_dir = copy_model(qwen3_causal)
    _weights(model_dir).chmod(0)
    try:
        with pytest.raises(ScoringInputError, match="model.safetensors in .* cannot be read"):
            Scorer.from_pretrained(model_dir, CONFIG)
    finally:
        _weights(model_dir).chmod(0o644)


@pytest.mark.parametrize(
    "keep", [("config.json",), ("config.json", "tokenizer.json", "tokenizer_config.json")]
)
def test_no_weight_files(qwen3_causal, copy_model, keep):
    model_dir = copy_model(qwen3_causal)
    for file in model_dir.iterdir():
        if file.name not in keep:
            file.unlink()
    with pytest.raises(ScoringInputError, match=r"no weight files \(model.safetensors.*\) in ") as error:
        Scorer.from_pretrained(model_dir, replace(CONFIG, allow_pickle=True))
    assert "allow_pickle" not in str(error.value) and not isinstance(error.value, SettingError)


def test_sharded_index_naming_a_missing_shard(qwen3_causal, copy_model):
    model_dir = copy_model(qwen3_causal)
    tensors = load_file(_weights(model_dir))
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[:3]}, model_dir / "model-00001-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names[:3]}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in names[3:]})
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _weights(model_dir).unlink()
    with pytest.raises(ScoringInputError, match="model-00002-of-00002.safetensors is missing from"):
        Scorer.from_pretrained(model_dir, CONFIG)


def test_pickle_weights_truncated(qwen3_causal, copy_model):
    model_dir = copy_model(qwen3_causal)
    torch.save(load_file(_weights(model_dir)), model_dir / "pytorch_model.bin")
    _weights(model_dir).unlink()
    _truncate(model_dir / "pytorch_model.bin", lambda n: n // 2)
    with pytest.raises(
        ScoringInputError, match="pytorch_model.bin in .* is truncated or not a PyTorch weight file"
    ):
        Scorer.from_pretrained(model_dir, replace(CONFIG, allow_pickle=True))


@pytest.mark.parametrize("fault", ["missing", "misshapen"])
def test_checkpoint_that_does_not_match_the_config(qwen3_causal, copy_model, fault):
    # A valid safetensors file whose tensors would otherwise be filled with random values.
    model_dir = copy_model(qwen3_causal)
    tensors = load_file(_weights(model_dir))
    if fault == "missing":
        del tensors["lm_head.weight"]
    else:
        tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, _weights(model_dir), metadata={"format": "pt"})
    match = "lack tensors the model needs" if fault == "missing" else "do not match its config.json"
    with pytest.raises(ScoringInputError, match=match):
        Scorer.from_pretrained(model_dir, CONFIG)


# --- tokenizer and config files -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
def test_truncated_json_file_is_named(qwen3_causal, copy_model, name):
    model_dir = copy_model(qwen3_causal)
    _truncate(model_dir / name, lambda n: n // 2)
    with pytest.raises(ScoringInputError, match=f"{name} in .* is truncated or not valid JSON"):
        Scorer.from_pretrained(model_dir, CONFIG)


@pytest.mark.parametrize("per_layer_type", [False, True], ids=["one", "per-layer-type"])
def test_a_rope_type_transformers_cannot_build_is_named_by_the_cli(
    qwen3_causal, copy_model, tmp_path, per_layer_type
):
    model_dir = copy_model(qwen3_causal)
    config = json.loads((model_dir / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "bogus", "rope_theta": 10000.0, "factor": 2.0}
    if per_layer_type:  # as Gemma 3's configs keep them
        default = {"rope_type": "default", "rope_theta": 10000.0}
        config["rope_parameters"] = {
            "sliding_attention": default,
            "full_attention": config["rope_parameters"],
        }
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ScoringInputError, match="RoPE type 'bogus' is not one transformers knows"):
        Scorer.from_pretrained(model_dir, CONFIG)
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "a b", "item": "c d"}])
    ran = run_cli(str(data), "-o", str(tmp_path / "out.parquet"), "--model", str(model_dir), *LABEL_FLAGS)
    assert ran.returncode == 2 and "RoPE type 'bogus'" in ran.stderr and "Traceback" not in ran.stderr, (
        ran.stderr
    )


def test_tokenizer_json_of_the_wrong_shape(qwen3_causal, copy_model):
    model_dir = copy_model(qwen3_causal)
    raw = json.loads((model_dir / "tokenizer.json").read_text())
    raw["model"]["type"] = "NoSuchModel"
    (model_dir / "tokenizer.json").write_text(json.dumps(raw))
    with pytest.raises(ScoringInputError, match="cannot load a tokenizer from"):
        Scorer.from_pretrained(model_dir, CONFIG)


def test_no_tokenizer_files(qwen3_causal, copy_model):
    # transformers would build an empty tokenizer here, and the labels would then "not be one token".
    model_dir = copy_model(qwen3_causal)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_dir / name).unlink()
    with pytest.raises(ScoringInputError, match="no tokenizer files"):
        Scorer.from_pretrained(model_dir, CONFIG)


@pytest.mark.parametrize(
    "setting",
    [
        {"num_attention_heads": "x"},  # transformers' strict config: a field of the wrong type
        {"num_hidden_layers": 2.5},
        {"layer_types": ["no-such-layer"]},  # a class validator's refusal
        {"id2label": ["no", "yes"]},  # a list where transformers takes a dict: AttributeError inside it
    ],
    ids=["heads-str", "layers-float", "layer-types", "id2label-list"],
)
def test_a_config_transformers_refuses_is_named(qwen3_causal, copy_model, setting):
    model_dir = copy_model(qwen3_causal)
    raw = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**raw, **setting}))
    with pytest.raises(ScoringInputError, match="cannot read the config of") as raised:
        Scorer.from_pretrained(model_dir, CONFIG)
    assert "\n" not in str(raised.value)  # the CLI's one error line
    data = write_jsonl(model_dir.parent / "in.jsonl", [{"query": "I pledge allegiance", "item": " to"}])
    result = run_cli(data, "-o", model_dir.parent / "out.jsonl", "--model", model_dir, *LABEL_FLAGS)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


# --- the same through the CLI: exit 2, the file named, no traceback ------------------------------


@pytest.mark.parametrize("fault", ["truncated-weights", "config-only", "truncated-tokenizer"])
def test_cli_exits_2_naming_the_file(tmp_path, qwen3_causal, copy_model, fault):
    model_dir = copy_model(qwen3_causal)
    if fault == "truncated-weights":
        _truncate(_weights(model_dir), lambda n: n // 3)
        expected = "model.safetensors"
    elif fault == "config-only":
        for file in model_dir.iterdir():
            if file.name != "config.json":
                file.unlink()
        expected = "no weight files"
    else:
        _truncate(model_dir / "tokenizer.json", lambda n: n // 2)
        expected = "tokenizer.json"
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": "I pledge allegiance", "item": " to"}])
    for extra in ([], ["--dry-run"]):
        result = run_cli(data, "-o", tmp_path / "out.jsonl", "--model", model_dir, *LABEL_FLAGS, *extra)
        assert result.returncode == 2, (extra, result.stdout, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "allow-pickle" not in result.stderr
        assert not (tmp_path / "out.jsonl").exists()


# --- position limit -------------------------------------------------------------------------------

MAX_POSITIONS = 16


@pytest.fixture(scope="module")
def short_model(zoo):
    """A tiny decoder that allows MAX_POSITIONS positions."""
    return zoo.get("qwen3", "causal", max_position_embeddings=MAX_POSITIONS)


def _scorer(model_dir, **scoring) -> Scorer:
    """A scorer of model_dir whose planner carries the model's position limit."""
    scorer = Scorer.from_pretrained(model_dir, replace(CONFIG, scoring=replace(CONFIG.scoring, **scoring)))
    if scorer.planner.limits.max_positions is None:  # until engine/scorer.py passes it itself
        limits = replace(scorer.planner.limits, max_positions=scorer.setup.info.max_length)
        scorer.planner = Planner(scorer.planner.tokenizer, scorer.planner.cfg, limits)
    return scorer


def _lengths(model_dir, query, items):
    tok = tokenizer(str(model_dir))
    return len(tok(query)["input_ids"]), [len(tok(i, add_special_tokens=False)["input_ids"]) for i in items]


def _reference(model_dir, query, item):
    labels = [tokenizer(str(model_dir)).encode(t, add_special_tokens=False)[0] for t in LABELS]
    return reference_scores(model_dir, "causal", reference_sequence(model_dir, query, item), labels)[0]


QUERY = "Tokyo is a city in"
SHORT = " Japan"
LONG = " the quick brown fox jumps over the lazy dog to get to the other side of the country"


@pytest.mark.parametrize("packing", ["mis", "single"])
def test_item_past_the_position_limit_is_a_row_error(short_model, packing):
    q, (short, long) = _lengths(short_model, QUERY, [SHORT, LONG])
    assert (
        q + short <= MAX_POSITIONS < q + long and q + long + 4 < 8192
    )  # the pack limit alone would allow it
    result = _scorer(short_model, packing=packing).score([Group(QUERY, [SHORT, LONG, ""])])[0]
    assert result.errors[0] is None and result.errors[2] is None
    assert max_abs_diff(result.scores[0], _reference(short_model, QUERY, SHORT)) <= 1e-4
    assert max_abs_diff(result.scores[2], _reference(short_model, QUERY, "")) <= 1e-4
    error = result.errors[1]
    assert f"item 1 has {long} tokens, over the limit of {MAX_POSITIONS - q}" in error
    assert f"max_position_embeddings {MAX_POSITIONS}" in error and "set truncate to item-tail" in error
    assert np.isnan(result.scores[1]).all()


def test_item_tail_cuts_the_item_to_the_position_limit(short_model):
    q, _ = _lengths(short_model, QUERY, [])
    result = _scorer(short_model, truncate="item-tail").score([Group(QUERY, [SHORT, LONG])])[0]
    assert result.errors == [None, None]
    tok = tokenizer(str(short_model))
    cut = tok(LONG, add_special_tokens=False)["input_ids"][: MAX_POSITIONS - q]
    labels = [tok.encode(t, add_special_tokens=False)[0] for t in LABELS]
    expected = reference_scores(short_model, "causal", tok(QUERY)["input_ids"] + cut, labels)[0]
    assert max_abs_diff(result.scores[1], expected) <= 1e-4
    assert max_abs_diff(result.scores[0], _reference(short_model, QUERY, SHORT)) <= 1e-4


def test_query_past_the_position_limit(short_model):
    long_query = LONG + LONG
    q, _ = _lengths(short_model, long_query, [])
    assert q > MAX_POSITIONS
    result = _scorer(short_model).score([Group(long_query, [SHORT, ""])])[0]
    assert all("query has" in e and f"max_position_embeddings {MAX_POSITIONS}" in e for e in result.errors)
    assert "set truncate to query-head" in result.errors[0]


MEDIUM = " the quick brown fox jumps"


@pytest.mark.parametrize(
    "packing,item_first",
    [("mis", False), ("single", False), ("single", True)],
    ids=["mis", "single", "item-first"],
)
@pytest.mark.parametrize("template", [None, "Q: {query}\n"], ids=["plain", "template"])
def test_query_head_cuts_the_query_to_leave_each_item_its_room(short_model, packing, item_first, template):
    """Each (query, item) pair keeps the query's last MAX_POSITIONS - len(item) content tokens (the template
    kept): the plain-HF forward over exactly those tokens, whatever the group's other items; an item that
    cannot fit beside the query's template is a row error that names longest-first."""
    long_query = LONG + LONG
    tok = tokenizer(str(short_model))
    labels = [tok.encode(t, add_special_tokens=False)[0] for t in LABELS]
    prefix, suffix = template.split("{query}") if template else ("", "")
    head = tok(prefix, add_special_tokens=False)["input_ids"] if prefix else []
    tail = tok(suffix, add_special_tokens=False)["input_ids"] if suffix else []
    content = tok(long_query, add_special_tokens=False)["input_ids"]
    assert len(head) + len(content) + len(tail) > MAX_POSITIONS  # the query alone is past the limit
    items = ["", SHORT, MEDIUM, LONG]
    ids = [tok(item, add_special_tokens=False)["input_ids"] for item in items]
    scorer = _scorer(
        short_model, truncate="query-head", packing=packing, query_template=template, item_first=item_first
    )
    result = scorer.score([Group(long_query, items)])[0]
    fixed = len(head) + len(tail)
    for index, item_ids in enumerate(ids):
        room = MAX_POSITIONS - len(item_ids) - fixed  # the query's content tokens this pair keeps
        if room < (0 if fixed or item_first else 1):
            assert "query-head cuts only the query" in result.errors[index]
            assert "longest-first" in result.errors[index] and np.isnan(result.scores[index]).all()
            continue
        assert result.errors[index] is None, result.errors[index]
        query_ids = head + (content[len(content) - room :] if room else []) + tail
        sequence = item_ids + query_ids if item_first else query_ids + item_ids
        assert len(sequence) == MAX_POSITIONS
        expected = reference_scores(short_model, "causal", sequence, labels)[0]
        assert max_abs_diff(result.scores[index], expected) <= 1e-4, index
        alone = scorer.score([Group(long_query, [items[index]])])[0]  # its neighbours change nothing
        assert max_abs_diff(alone.scores[0], result.scores[index]) <= 1e-4
    assert result.errors[3] is not None or item_first  # LONG cannot fit beside even one query token


def test_token_id_input_obeys_the_position_limit(short_model):
    result = _scorer(short_model).score(
        [Group([5, 6, 7], [[8] * (MAX_POSITIONS - 3), [8] * (MAX_POSITIONS - 2)])]
    )[0]
    assert (
        result.errors[0] is None
        and f"item 1 has {MAX_POSITIONS - 2} tokens, over the limit of {MAX_POSITIONS - 3}"
        in result.errors[1]
    )


def test_rope_scaling_extends_the_position_limit(tmp_path, short_model):
    from score_batch.engine.model.loading import read_model_info

    raw = json.loads((short_model / "config.json").read_text())
    raw["rope_scaling"] = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": MAX_POSITIONS,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert read_model_info(tmp_path).max_length == 4 * MAX_POSITIONS
    assert read_model_info(short_model).max_length == MAX_POSITIONS


def _require_wiring(model_dir):
    """The planner Scorer and dry runs build must carry the model's position limit (engine/scorer.py)."""
    planner, _ = load_planner(model_dir, CONFIG)
    if planner.limits.max_positions is None:
        pytest.xfail("engine/scorer.py does not yet pass the model's limit as PlanLimits.max_positions")


def test_position_limit_reaches_the_planner(short_model):
    _require_wiring(short_model)
    planner, setup = load_planner(short_model, CONFIG)
    assert planner.limits.max_positions == MAX_POSITIONS == setup.info.max_length


def test_cli_records_an_over_long_item(tmp_path, short_model):
    _require_wiring(short_model)
    rows = [
        {"query_id": "a", "query": QUERY, "item_id": "short", "item": SHORT},
        {"query_id": "a", "query": QUERY, "item_id": "long", "item": LONG},
    ]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    result = run_cli(data, "-o", out, "--model", short_model, *LABEL_FLAGS, "--on-error", "record")
    assert result.returncode == 0, result.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert (
        got[0]["error"] is None and abs(got[0]["score"] - _reference(short_model, QUERY, SHORT)[-1]) <= 1e-4
    )
    assert "max_position_embeddings" in got[1]["error"] and got[1]["score"] is None
    assert "--" not in got[1]["error"].split("(")[0]
    result = run_cli(
        data, "-o", out, "--model", short_model, *LABEL_FLAGS, "--truncate", "item-tail", "--overwrite"
    )
    assert result.returncode == 0, result.stderr
    assert all(json.loads(line).get("error") is None for line in out.read_text().splitlines())


def test_the_weight_check_runs_no_python_import_inside_safetensors(qwen3_causal):
    """safe_open(framework="pt") imports torch from inside its Rust frames; a stop raised during that import
    aborted the whole process ("Rust cannot catch foreign exceptions"). The check reads headers only."""
    import subprocess
    import sys

    code = (
        "import sys; from score_batch.engine.model.source import check_weight_files, resolve_model_dir; "
        f"check_weight_files({str(qwen3_causal)!r}); print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
