"""The model: resolving and checking its directory, its kind, loading it, profiles, the saved CrossEncoder
config, and load_planner (the one way an engine is built, with its kernels proved at load)."""
