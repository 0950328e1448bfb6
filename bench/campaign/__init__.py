"""The stages of bench/gpu_campaign.py, a module each, and the processes and summary they share."""
