"""A run's data: the datasets as files on disk (datasets.py, user_data.py), their partition over clients
(partition.py), the federated data a simulation trains on (federated.py), augmentation, and a dataset shown."""
