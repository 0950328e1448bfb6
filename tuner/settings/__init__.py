"""A run's settings: the configuration and its resolution (config.py), how values typed on the command line become
typed settings, the papers' settings and published numbers, each method's defaults, tuned files, and a schedule
of settings round by round."""
