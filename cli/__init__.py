"""The score-batch command line."""
