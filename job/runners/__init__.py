"""The runners (local, Ray, an OpenAI-style batch file) and the scoring phase they share: the engine loaded,
windows scored (prepared, planned, run, prefetched and written in turn)."""
