"""Built-in scoring profiles (JSON files beside this one) for well-known models; read by cli/profile.py."""
