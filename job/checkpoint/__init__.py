"""Was this already done? A run's identity, the input's and the model's digests, a finished output's completion
record and its check, and the checkpoint parts a killed run resumes from."""
