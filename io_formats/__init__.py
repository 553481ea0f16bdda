"""Reading query/item tables and writing score tables (Parquet, JSONL, stdin/stdout); no engine imports."""
