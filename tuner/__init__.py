"""pFL tuner: federated simulations, hyperparameter sweeps and paper tables."""
