"""Running packed and paired batches through the model: runners, heads (score_and_pool), result tables, ranks."""
