"""Text to tokens: the tokenizer binding, templates and truncation, long-document chunks, encoder pairs."""
