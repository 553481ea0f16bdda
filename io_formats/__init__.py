"""Reading query/item tables and writing score tables (Parquet, JSONL, stdin/stdout); no engine imports."""

from score_batch.io_formats.errors import InputError

__all__ = ["InputError"]
