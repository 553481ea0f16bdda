"""The names of the columns score-batch writes, declared once (job/preflight/contract.py owns their types and
order)."""

from __future__ import annotations

ROW_INDEX = "row_index"  # the input row an output row came from (0-based; JSONL: line number - 1)
QUERY_ID = "query_id"
ITEM_ID = "item_id"
SCORE = "score"
SCORES = "scores"
CHUNKS = "chunks"  # --truncate chunk: how many chunks the item was scored as (1 when it fit)
POOLED = "pooled_hidden_state"
RANK = "rank"  # 1 = the best item of its query (with --rank / --top-k)
ERROR = "error"
SCORE_KEY = "score_key"  # every scored output row: hex digest of (model, scoring settings, query, item)
QUERY_KEY = "query_key"  # checkpoint parts of ranked runs: which query a row belongs to, across windows
REUSED_FLAG = "__reused"  # Ray actors' batches: pairs copied from --reuse (a count, on a batch's first row)
DUPLICATES = "__duplicates"  # Ray actors' batches: pairs copied from earlier ones (ditto)
REUSE_INCOMPLETE = "__reuse_incomplete"  # Ray actors' batches: pairs --reuse found incomplete (ditto)
TALLY_COLUMNS = (REUSED_FLAG, REUSE_INCOMPLETE, DUPLICATES)
ID_COLUMNS = (QUERY_ID, ITEM_ID)
ERROR_FIELDS = (ROW_INDEX, QUERY_ID, ITEM_ID, ERROR)  # one line of the errors file
