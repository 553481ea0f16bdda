"""Where scored rows go: the sinks (merged checkpoint parts, stdout, a Ray run's staged directory, the errors
file) and the ranking of a finished output's parts."""
