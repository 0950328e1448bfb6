"""Many federated runs as one Ray Tune experiment, a room a concern:

    trainable   one federated run as a Tune trial: report, checkpoint, restore
    stopping    ASHA over rounds, patience, the sweep's round budget, failures not worth a retry
    console     the progress line and Ray's and Optuna's logging
    cluster     what a trial asks for, Ray started or joined, workers and the rounds they share
    stages      the search stage, the seed reruns, resume and a clean stop

The best trial of a stage is chosen by tuner/selection.py, as everywhere.
"""
