"""Build the demo dataset and train the demo reranker in sample_data/ (reproducible, CPU, a few minutes).

    python scripts/train_demo_model.py            # writes sample_data/products.{parquet,jsonl} and cli/demo_model/
    python scripts/train_demo_model.py --cross-encoder-config   # only the CrossEncoder files (no training)

The model is a tiny Qwen3ForCausalLM trained to answer " yes" / " no" after a product-search prompt; its
score_batch.json holds the templates and labels, so `score-batch sample_data/products.parquet` needs no flags.
Its sentence-transformers CrossEncoder configuration (modules.json: Transformer + LogitScore(" yes", " no"),
a chat template rendering the same templates) makes `CrossEncoder(demo_model_path())` score as Scorer does.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: tests/ holds the tiny-model fixtures
from tests.tiny_models import build_tokenizer, tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "sample_data"
MODEL_DIR = Path(__file__).resolve().parent.parent / "cli" / "demo_model"
SEED = 1234
QUERY_TEMPLATE = "Search: {query}\n"
ITEM_TEMPLATE = "Product: {item}\nRelevant:"
LABELS = [" no", " yes"]

CATEGORIES = {
    "running shoes": ["sneaker", "trail runner", "road running shoe"],
    "headphones": ["over-ear headphones", "wireless earbuds", "noise cancelling headset"],
    "backpack": ["daypack", "laptop backpack", "hiking rucksack"],
    "coffee mug": ["ceramic mug", "travel mug", "espresso cup"],
    "desk lamp": ["LED desk lamp", "reading light", "clamp lamp"],
    "rain jacket": ["waterproof shell", "packable rain coat", "hooded windbreaker"],
    "smart watch": ["fitness tracker", "GPS watch", "smartwatch"],
    "yoga mat": ["exercise mat", "non-slip yoga mat", "travel yoga mat"],
    "water bottle": ["insulated bottle", "sports bottle", "glass water bottle"],
    "phone case": ["silicone case", "wallet phone case", "rugged phone cover"],
}
COLORS = ["black", "white", "red", "blue", "green", "grey", "pink", "yellow"]
BRANDS = ["Acme", "Northpeak", "Lumo", "Vireo", "Kestrel", "Orbit", "Tandem", "Halcyon"]
EXTRAS = [
    "lightweight",
    "durable",
    "best seller",
    "new arrival",
    "eco friendly",
    "on sale",
    "premium",
    "compact",
]


def make_item(rng: random.Random, category: str, color: str) -> str:
    """A product title of a category and color."""
    kind = rng.choice(CATEGORIES[category])
    return f"{rng.choice(BRANDS)} {color} {kind} ({category}), {rng.choice(EXTRAS)}"


def make_dataset(num_queries: int, rng: random.Random) -> list[dict]:
    """Queries '<color> <category>' with relevant items (same category and color) and hard/easy negatives."""
    rows = []
    for q in range(num_queries):
        category, color = rng.choice(list(CATEGORIES)), rng.choice(COLORS)
        query = rng.choice(["{c} {k}", "{k} in {c}", "{c} {k} for women", "cheap {c} {k}"]).format(
            c=color, k=category
        )
        candidates = []
        for _ in range(rng.randint(2, 4)):
            candidates.append((make_item(rng, category, color), 1))
        for _ in range(rng.randint(2, 4)):
            candidates.append((make_item(rng, category, rng.choice([c for c in COLORS if c != color])), 0))
        for _ in range(rng.randint(2, 4)):
            other = rng.choice([k for k in CATEGORIES if k != category])
            candidates.append((make_item(rng, other, rng.choice(COLORS)), 0))
        rng.shuffle(candidates)
        for i, (item, label) in enumerate(candidates):
            rows.append(
                {
                    "query_id": f"q{q:04d}",
                    "query": query,
                    "item_id": f"q{q:04d}-{i}",
                    "item": item,
                    "label": label,
                }
            )
    return rows


def encode(tokenizer, row: dict) -> list[int]:
    """The reference sequence of a row, as score-batch builds it."""
    query = tokenizer(QUERY_TEMPLATE.replace("{query}", row["query"]))["input_ids"]
    item = tokenizer(ITEM_TEMPLATE.replace("{item}", row["item"]), add_special_tokens=False)["input_ids"]
    return query + item


def train(model, tokenizer, rows: list[dict], label_ids: list[int], steps: int, rng: random.Random) -> None:
    """Cross-entropy on the label token at the last position (full vocabulary), AdamW, padded mini-batches."""
    from torch.nn.utils.rnn import pad_sequence

    encoded = [(torch.tensor(encode(tokenizer, r)), label_ids[r["label"]]) for r in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        batch = rng.sample(encoded, 64)
        ids = pad_sequence([b[0] for b in batch], batch_first=True, padding_value=tokenizer.pad_token_id)
        lengths = torch.tensor([len(b[0]) for b in batch])
        mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
        logits = model(input_ids=ids, attention_mask=mask).logits  # [batch, seq, vocab]
        last = logits[torch.arange(len(batch)), lengths - 1]  # [batch, vocab]
        loss = torch.nn.functional.cross_entropy(last, torch.tensor([b[1] for b in batch]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    model.eval()


def main(steps: int = 800) -> None:
    """Write the dataset files and the trained model."""
    from transformers import AutoModelForCausalLM

    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    rows = make_dataset(300, rng)
    for row in rows:
        row["split"] = "test" if int(row["query_id"][1:]) % 5 == 0 else "train"
    ROOT.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), ROOT / "products.parquet")
    with open(ROOT / "products.jsonl", "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")

    model_dir = MODEL_DIR
    corpus = [
        QUERY_TEMPLATE.replace("{query}", r["query"]) + ITEM_TEMPLATE.replace("{item}", r["item"])
        for r in rows
    ]
    tokenizer = build_tokenizer(model_dir, corpus=corpus + LABELS * 50, vocab_size=800)
    label_ids = [tokenizer.encode(t, add_special_tokens=False)[0] for t in LABELS]
    config = tiny_config(
        "qwen3",
        "causal",
        len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    train(model, tokenizer, [r for r in rows if r["split"] == "train"], label_ids, steps, rng)
    model.save_pretrained(model_dir, safe_serialization=True)
    profile = {
        "query_template": QUERY_TEMPLATE,
        "item_template": ITEM_TEMPLATE,
        "label_tokens": LABELS,
        "apply_softmax": True,
        "score_index": -1,
    }
    (model_dir / "score_batch.json").write_text(json.dumps(profile, indent=2) + "\n")
    write_cross_encoder_config(model_dir, label_ids)
    print(f"wrote {ROOT / 'products.parquet'} ({len(rows)} rows) and {model_dir}")


def write_cross_encoder_config(model_dir: Path, label_ids: list[int]) -> None:
    """The files sentence-transformers' CrossEncoder loads the model from, as CrossEncoder.save writes them:
    Transformer(text-generation) rendering a (query, document) pair through a chat template that writes
    QUERY_TEMPLATE + ITEM_TEMPLATE, then LogitScore(logit[" yes"] - logit[" no"]) and a sigmoid: P(" yes")
    of a softmax over the two labels, the score_batch.json score."""
    false_id, true_id = label_ids  # LABELS: " no", " yes"

    def render(template: str, placeholder: str) -> str:
        prefix, suffix = template.split(placeholder)
        return "{{ " + json.dumps(prefix) + " + message['content'] + " + json.dumps(suffix) + " }}"

    chat_template = (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'query' -%}" + render(QUERY_TEMPLATE, "{query}") + ""
        "{%- elif message['role'] == 'document' -%}" + render(ITEM_TEMPLATE, "{item}") + ""
        "{%- endif -%}{%- endfor -%}"
    )
    (model_dir / "chat_template.jinja").write_text(chat_template)
    files = {
        "modules.json": [
            {
                "idx": 0,
                "name": "0",
                "path": "",
                "type": "sentence_transformers.base.modules.transformer.Transformer",
            },
            {
                "idx": 1,
                "name": "1",
                "path": "1_LogitScore",
                "type": "sentence_transformers.cross_encoder.modules.logit_score.LogitScore",
            },
        ],
        "config_sentence_transformers.json": {
            "activation_fn": "torch.nn.modules.activation.Sigmoid",
            "default_prompt_name": None,
            "model_type": "CrossEncoder",
            "prompts": {},
        },
        "sentence_bert_config.json": {
            "transformer_task": "text-generation",
            "modality_config": {
                "text": {"method": "forward", "method_output_name": "logits"},
                "message": {"method": "forward", "method_output_name": "logits", "format": "flat"},
            },
            "module_output_name": "causal_logits",
        },
        "1_LogitScore/config.json": {
            "true_token_id": true_id,
            "false_token_id": false_id,
            "module_input_name": "causal_logits",
        },
    }
    for name, content in files.items():
        (model_dir / name).parent.mkdir(exist_ok=True)
        (model_dir / name).write_text(json.dumps(content, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--cross-encoder-config"]:  # the trained model's tokenizer gives the label ids
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
        write_cross_encoder_config(
            MODEL_DIR, [tokenizer.encode(t, add_special_tokens=False)[0] for t in LABELS]
        )
    else:
        main()
